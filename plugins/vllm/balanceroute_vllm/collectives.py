"""The two variable-size collectives vLLM's CPU communicator lacks, over any torch process group.

A MoE layer with data parallelism > 1 gathers every rank's tokens before the experts
(``all_gatherv``) and hands each rank back the sum over ranks of its own rows
(``reduce_scatterv``). vLLM 0.32's ``CpuCommunicator`` inherits both as ``NotImplementedError``,
so a CPU ``--data-parallel-size 2`` MoE server dies on its first request. Gloo has neither a
variable-size all-gather nor a reduce-scatter, so:

- ``all_gatherv``: pad each rank's rows to the largest rank's count, all-gather, then slice;
- ``reduce_scatterv``: all-reduce the whole tensor, then keep this rank's rows.

Both take the rows along dimension 0 (the only one vLLM's all-to-all managers use). Time spent
inside them (waiting for the slowest rank included) is added to ``COMM_SECONDS``, which the step
telemetry reports as the rank's time in the group's collectives.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

COMM_SECONDS = [0.0]  # one process-wide accumulator (a list so that importers see updates)
INSTALLED = [False]  # whether install() gave the CPU communicator these collectives


def _check_sizes(sizes: Sequence[int], world_size: int, what: str) -> list[int]:
    sizes = [int(s) for s in sizes]
    if len(sizes) != world_size or any(s < 0 for s in sizes):
        raise ValueError(f"{what}: sizes must be {world_size} non-negative counts, got {sizes}")
    return sizes


def gather_rows(
    tensor: torch.Tensor, sizes: Sequence[int] | None, group: dist.ProcessGroup
) -> torch.Tensor:
    """Every rank's rows (``sizes[r]`` of them from rank ``r``), concatenated in rank order."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    sizes = _check_sizes(sizes if sizes is not None else [tensor.shape[0]] * world, world,
                         "all_gatherv")  # fmt: skip
    if tensor.shape[0] != sizes[rank]:
        raise ValueError(f"all_gatherv: rank {rank} has {tensor.shape[0]} rows, sizes say "
                         f"{sizes[rank]}")  # fmt: skip
    widest = max(sizes)
    padded = tensor.new_zeros((widest, *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[:n] for p, n in zip(parts, sizes, strict=True)], dim=0)


def scatter_sum_rows(
    tensor: torch.Tensor, sizes: Sequence[int] | None, group: dist.ProcessGroup
) -> torch.Tensor:
    """This rank's rows of the element-wise sum over ranks (rank ``r`` owns ``sizes[r]`` rows)."""
    world = dist.get_world_size(group)
    rank = dist.get_rank(group)
    if sizes is None:
        if tensor.shape[0] % world:
            raise ValueError(f"reduce_scatterv: {tensor.shape[0]} rows do not split in {world}")
        sizes = [tensor.shape[0] // world] * world
    sizes = _check_sizes(sizes, world, "reduce_scatterv")
    if sum(sizes) != tensor.shape[0]:
        raise ValueError(f"reduce_scatterv: sizes {sizes} do not add up to {tensor.shape[0]} rows")
    total = tensor.contiguous().clone()
    dist.all_reduce(total, group=group)
    start = sum(sizes[:rank])
    return total[start : start + sizes[rank]].contiguous()


def all_gatherv(
    self: object,
    input_: torch.Tensor | list[torch.Tensor],
    dim: int = 0,
    sizes: list[int] | None = None,
) -> torch.Tensor | list[torch.Tensor]:
    """``DeviceCommunicatorBase.all_gatherv`` for the CPU communicator (rows along dim 0)."""
    if dim != 0:
        raise NotImplementedError(f"all_gatherv over gloo gathers along dim 0 only, not {dim}")
    t0 = time.perf_counter()
    group = self.device_group  # type: ignore[attr-defined]
    try:
        if isinstance(input_, (list, tuple)):
            return [gather_rows(t, sizes, group) for t in input_]
        return gather_rows(input_, sizes, group)
    finally:
        COMM_SECONDS[0] += time.perf_counter() - t0


def reduce_scatterv(
    self: object, input_: torch.Tensor, dim: int = -1, sizes: list[int] | None = None
) -> torch.Tensor:
    """``DeviceCommunicatorBase.reduce_scatterv`` for the CPU communicator (any dim)."""
    t0 = time.perf_counter()
    dim = dim % input_.dim()
    try:
        moved = input_.movedim(dim, 0) if dim else input_
        out = scatter_sum_rows(moved, sizes, self.device_group)  # type: ignore[attr-defined]
        return out.movedim(0, dim).contiguous() if dim else out
    finally:
        COMM_SECONDS[0] += time.perf_counter() - t0


def install() -> bool:
    """Give vLLM's CPU communicator both collectives where it lacks them; True if installed."""
    from vllm.distributed.device_communicators.base_device_communicator import (
        DeviceCommunicatorBase,
    )
    from vllm.distributed.device_communicators.cpu_communicator import CpuCommunicator

    done = False
    if CpuCommunicator.all_gatherv is DeviceCommunicatorBase.all_gatherv:
        CpuCommunicator.all_gatherv = all_gatherv  # type: ignore[method-assign]
        done = True
    if CpuCommunicator.reduce_scatterv is DeviceCommunicatorBase.reduce_scatterv:
        CpuCommunicator.reduce_scatterv = reduce_scatterv  # type: ignore[method-assign]
        done = True
    INSTALLED[0] = INSTALLED[0] or done
    return done

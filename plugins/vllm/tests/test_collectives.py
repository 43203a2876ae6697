"""The CPU collectives on a real 2-process gloo group (torch required; no vLLM needed).

Run in the vLLM environment: ``VENV/bin/python -m pytest plugins/vllm/tests`` (scripts/real_group.sh
--selftest does). Each case spawns two processes that build a gloo group on 127.0.0.1 and
compare the plugin's result with the same figure computed from every rank's inputs.
"""

from __future__ import annotations

import socket

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
mp = pytest.importorskip("torch.multiprocessing")

from balanceroute_vllm.collectives import gather_rows, scatter_sum_rows  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "int64": torch.int64}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rows(rank: int, n: int, width: int, dtype: torch.dtype) -> torch.Tensor:
    """Rank-specific rows whose values are exact in every dtype used here."""
    base = torch.arange(n * width, dtype=torch.float32).reshape(n, width) + 100 * (rank + 1)
    return base.to(dtype)


def _worker(rank: int, port: int, case: dict, out: dict) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)  # fmt: skip
    try:
        dtype, sizes, width = DTYPES[case["dtype"]], case["sizes"], case["width"]
        mine = _rows(rank, sizes[rank], width, dtype)
        gathered = gather_rows(mine, sizes, dist.group.WORLD)
        full = _rows(rank, sum(sizes), width, dtype)
        scattered = scatter_sum_rows(full, sizes, dist.group.WORLD)
        out[rank] = (gathered.float().tolist(), scattered.float().tolist())
    finally:
        dist.destroy_process_group()


def _run(case: dict) -> dict:
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_worker, args=(_free_port(), case, out), nprocs=2, join=True)
    return dict(out)


@pytest.mark.parametrize(
    "case",
    [
        {"sizes": [3, 5], "width": 4, "dtype": "float32"},
        {"sizes": [0, 2], "width": 3, "dtype": "bfloat16"},
        {"sizes": [4, 4], "width": 2, "dtype": "int64"},
    ],
    ids=["uneven", "empty-rank-bf16", "even-int"],
)
def test_gather_and_scatter_match_the_definition(case: dict) -> None:
    result = _run(case)
    sizes, width, dtype = case["sizes"], case["width"], DTYPES[case["dtype"]]
    expected_gather = torch.cat([_rows(r, sizes[r], width, dtype) for r in range(2)]).float()
    total = sum(_rows(r, sum(sizes), width, dtype).float() for r in range(2))
    for rank in range(2):
        gathered, scattered = result[rank]
        assert torch.equal(torch.tensor(gathered).reshape(-1, width), expected_gather)
        start = sum(sizes[:rank])
        want = total[start : start + sizes[rank]]
        assert torch.equal(torch.tensor(scattered).reshape(-1, width), want)


def test_sizes_that_do_not_match_the_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="sizes"):
        # one process, world size 1: the size check runs before any communication
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0,
                                world_size=1)  # fmt: skip
        try:
            scatter_sum_rows(torch.zeros(3, 2), [2], dist.group.WORLD)
        finally:
            dist.destroy_process_group()

"""One block replayed from an empty group: the twin's, the comparison's and the prior's one replay."""

from __future__ import annotations

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.lab.twin.config import Finished, TwinGroup
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import RequestTable


def block_imbalance(result) -> tuple[float, float, int]:
    """Steady mean imbalance, whole-run mean imbalance and steady iterations of a replay."""
    imb = result.imbalance
    steady = result.waiting > 0
    n = int(steady.sum())
    s = float(imb[steady].mean()) if n else float("nan")
    return s, float(imb.mean()) if imb.size else float("nan"), n


def replay_candidate(
    group: TwinGroup,
    released: ReleasedRequests,
    w: float,
    estimator: CompletionEstimator | None,
) -> tuple[float, float, int, int]:
    """One candidate's replay of a block from an empty group: steady and whole-run mean
    imbalance, steady iterations and iterations (``estimator`` unused at ``w = 0``)."""
    options = {**group.router.options, "twin": False, "guard": False, "blend": w}
    spec = RouterSpec(group.router.router, group.router.estimator, options, label="twin")
    return replay_block(released, spec.build_policy(None if w == 0.0 else estimator), group)


def replay_block(
    released: ReleasedRequests, policy: Policy, group: TwinGroup
) -> tuple[float, float, int, int]:
    """``policy``'s replay of a block on ``group`` from an empty group: steady and whole-run
    mean imbalance, steady iterations and iterations (the twin's and the comparison's one replay)."""
    cfg = SimConfig(
        workers=group.workers,
        slots=group.slots,
        cost=group.cost,
        seed=group.seed,
        validate=False,
        record_loads=False,
    )
    result = simulate(released, policy, cfg)
    s, a, n = block_imbalance(result)
    return s, a, n, result.iterations


def block_releases(block: Finished) -> ReleasedRequests:
    """A block of finished requests as the simulator's releases, from time 0."""
    return ReleasedRequests(
        release_s=block.release_s - block.release_s.min(),
        prompt_tokens=block.prompt_tokens.astype(np.int64),
        output_tokens=np.maximum(block.output_tokens.astype(np.int64), 1),
        table=RequestTable(
            prompt_tokens=block.prompt_tokens.astype(np.int64),
            prompt_key=block.prompt_key,
            trace_index=block.trace_index,
        ),
    )

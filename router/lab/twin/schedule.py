"""The twin over a replayed trace's past: the weight each A/B window routes with (causal)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.twin.config import Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.state import Admissions, RouterState


class ScheduledBlend(Policy):
    """A twin-managed policy at the weight a twin chose before the run (the A/B's windows:
    the twin decided on the requests before the window), with that twin's statistics."""

    def __init__(self, inner: Policy, weight: float, stats: dict[str, Any]) -> None:
        self.inner = inner
        self.weight = weight
        self.stats = stats
        self.name = inner.name
        self.maximal = inner.maximal

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.inner.set_blend(self.weight)

    def route(self, state: RouterState) -> Admissions:
        return self.inner.route(state)

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.inner.on_complete(positions, output_tokens, finish_s, iteration)

    def run_stats(self) -> dict[str, Any]:
        return {**self.inner.run_stats(), **self.stats, "twin_weight_mean": self.weight}

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


@dataclass(frozen=True)
class ScheduleEntry:
    """The twin's weight once the requests before ``known_from`` have all finished."""

    known_from: int  # arrival index from which the decision is known
    weight: float
    decisions: int
    switches: int


def finished_all(released: ReleasedRequests, block: int) -> Finished:
    """Every request of a replayed trace as a completion, each known to have finished by the
    first release two blocks later (a conservative completion lag for the shadow estimator)."""
    n = released.size
    idx = np.arange(n, dtype=np.int64)
    later = np.minimum((idx // block + 2) * block, n - 1)
    finish = np.where(later > idx, released.release_s[later], np.inf)
    t = released.table
    return Finished(
        idx,
        released.release_s,
        t.prompt_tokens,
        t.prompt_key,
        t.trace_index,
        released.output_tokens,
        finish,
    )


def twin_schedule(
    group: TwinGroup,
    estimator: CompletionEstimator | None,
    released: ReleasedRequests,
    config: TwinConfig | None = None,
    warm: SequentialTest | None = None,
) -> tuple[list[ScheduleEntry], dict[str, Any]]:
    """The twin run over a whole trace's past, block by block: after each block, from which
    arrival on its decision is known (a block's length after the block's end: the block must
    have finished) and the weight. A window starting at request ``s`` uses the last entry with
    ``known_from <= s`` (causal: only requests before the window). A ``warm`` test (the
    twin's warm-up on the training portion) is where the test starts, known from arrival 0."""
    twin = DecodeTwin(group, estimator, config, warm=warm)
    twin.observe(finished_all(released, twin.size))
    entries = []
    if warm is not None:
        entries.append(ScheduleEntry(0, warm.weight, warm.decisions, warm.switches))
    while twin.ready():
        twin.step()
        t = twin.test
        entries.append(
            ScheduleEntry(
                (twin.next_block - 1) * twin.stride + 2 * twin.size,
                t.weight,
                t.decisions,
                t.switches,
            )
        )
    return entries, twin.stats()


def scheduled_weight(
    entries: list[ScheduleEntry], start: int, default: float
) -> tuple[float, dict[str, Any]]:
    """The weight a window starting at arrival ``start`` routes with, and what it rests on."""
    known = [e for e in entries if e.known_from <= start]
    if not known:
        return default, {"twin_weight": default, "twin_decisions": 0, "twin_switches": 0}
    e = known[-1]
    return e.weight, {
        "twin_weight": e.weight,
        "twin_decisions": e.decisions,
        "twin_switches": e.switches,
    }

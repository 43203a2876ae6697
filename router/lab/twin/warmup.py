"""The twin's warm start: a warm-up on the training portion before the replay, leakage-free.

Where the live estimator is trained on the fly on a trace's earlier ``train_fraction``, the
twin gets its own estimator fitted on the earlier ``1 - warm_start`` of that portion only and
replays the rest of it in blocks (its shadow learning online, as it does on the run), so its
sequential test has evidence before the first replayed request. The run's twin then continues
that test with a copy of the live estimator (which never saw a replayed request either). A
registered model has no history it did not see: no warm start there (docs/design.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pandas as pd

from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.factory import build_estimator
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.replay_spec import ReplaySpec, released_requests
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.schedule import finished_all
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.specs import RouterSpec


@dataclass(frozen=True)
class WarmSplit:
    """The training portion cut in two: the twin's estimator fits on ``fit``, replays ``warm``."""

    fit: pd.DataFrame
    warm: pd.DataFrame  # arrivals rebased to 0


@dataclass(frozen=True)
class WarmStart:
    """The twin's test after its warm-up, and what it rests on."""

    test: SequentialTest
    fit_requests: int
    warm_requests: int
    fit_last_arrival_s: float  # in the training portion's clock
    warm_first_arrival_s: float

    def stats(self) -> dict[str, Any]:
        """The warm start for a run summary."""
        return {
            "twin_warm_blocks": self.test.decisions,
            "twin_warm_weight": self.test.weight,  # the weight at the replay's start
            "twin_warm_switches": self.test.switches,
            "twin_warm_fit_requests": self.fit_requests,
            "twin_warm_requests": self.warm_requests,
        }


def warm_split(history: pd.DataFrame, fraction: float) -> WarmSplit | None:
    """The later ``fraction`` of ``history`` (by arrival) to replay, the rest to fit on."""
    n = len(history)
    cut = round(n * (1.0 - fraction))
    if fraction <= 0.0 or cut < 1 or n - cut < 1:
        return None
    ordered = history.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    warm = ordered.iloc[cut:].reset_index(drop=True)
    warm["arrival_s"] = warm["arrival_s"] - warm["arrival_s"].iloc[0]
    return WarmSplit(ordered.iloc[:cut].reset_index(drop=True), warm)


def warm_fraction(router: RouterSpec, config: TwinConfig) -> float:
    """The share of the training portion the twin replays: the arm's ``twin_warm`` option,
    else the run's ``warm_start``."""
    own = router.options.get("twin_warm")
    return config.warm_start if own is None else float(own)


def warm_up(
    group: TwinGroup,
    estimator: CompletionEstimator | None,
    released: ReleasedRequests,
    config: TwinConfig,
) -> SequentialTest:
    """The twin's sequential test after replaying every complete block of ``released``."""
    twin = DecodeTwin(group, estimator, config)
    twin.observe(finished_all(released, twin.size))
    while twin.ready():
        twin.step()
    return twin.test


def warm_start(
    history: pd.DataFrame | None, spec: ReplaySpec, config: TwinConfig, horizon: int
) -> WarmStart | None:
    """The warm-up of ``spec``'s twin on ``history`` (the live estimator's training portion),
    or None where there is none: no history, a registered model, or ``warm_start = 0``."""
    est_spec = spec.router.estimator
    fraction = warm_fraction(spec.router, config)
    if history is None or est_spec is None or fraction <= 0.0:
        return None
    if not est_spec.needs_history or est_spec.model_uri is not None:
        return None
    split = warm_split(history, fraction)
    if split is None:
        return None
    estimator = build_estimator(est_spec, history=split.fit, replay=split.warm, horizon=horizon)
    released, _ = released_requests(split.warm, spec)
    group = TwinGroup(spec.router, spec.workers, spec.slots, spec.cost, spec.seed)
    return WarmStart(
        test=warm_up(group, estimator, released, config),
        fit_requests=len(split.fit),
        warm_requests=len(split.warm),
        fit_last_arrival_s=float(split.fit["arrival_s"].max()),
        warm_first_arrival_s=float(history["arrival_s"].sort_values().iloc[len(split.fit)]),
    )

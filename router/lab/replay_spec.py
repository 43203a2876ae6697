"""What one replay is: the workload, the group, the router and the prefill tier, and the
releases it turns a trace into (shared by the runner, the A/B harness and the twin's warm-up)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.schema import to_arrays
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.prefill import (
    PrefillConfig,
    ReleasedRequests,
    arrival_rps,
    rate_scale_for_load,
    release,
    sized_prefill,
)
from balanceroute.router.policies.specs import RouterSpec

MAX_SLOTS_TOTAL = 2**22  # slots of the whole group: per-slot state stays within memory


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """Everything that defines one replay besides the requests."""

    router: RouterSpec = field(default_factory=lambda: RouterSpec("count-jsq"))
    workers: int = 8
    slots: int = 64
    seed: int = 0
    cost: CostModel = field(default_factory=CostModel)
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    load: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.slots < 1:
            raise UserError(
                f"need at least one worker and one slot, got G={self.workers}, B={self.slots}"
            )
        if self.workers * self.slots > MAX_SLOTS_TOTAL:
            raise UserError(
                f"G x B is at most {MAX_SLOTS_TOTAL:,} slots in a replay, got "
                f"{self.workers:,} x {self.slots:,}"
            )


def resolved_prefill(frame: pd.DataFrame, spec: ReplaySpec) -> PrefillConfig:
    """The prefill tier of a replay: ``--load`` turned into a rate scale, ``instances = 0``
    into as many instances as the arrivals need."""
    arrays = to_arrays(frame)
    prefill = spec.prefill
    if spec.load is not None:
        if prefill.saturate:
            raise UserError("give either --load or --saturate, not both")
        scale = rate_scale_for_load(arrays, spec.load, spec.workers, spec.slots, spec.cost)
        prefill = PrefillConfig(**{**asdict(prefill), "rate_scale": scale})
    rps = arrival_rps(arrays, prefill.rate_scale)
    if prefill.saturate or rps is None:
        return PrefillConfig(**{**asdict(prefill), "instances": max(prefill.instances, 1)})
    return sized_prefill(arrays, prefill, rps)


def released_requests(frame: pd.DataFrame, spec: ReplaySpec) -> tuple[ReleasedRequests, float]:
    """Run the prefill tier; returns the releases and the rate scale actually used."""
    prefill = resolved_prefill(frame, spec)
    return release(to_arrays(frame), prefill), prefill.rate_scale

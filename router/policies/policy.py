"""The one routing-policy interface: ``route(state)`` from a snapshot to admissions."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from balanceroute.router.policies.state import Admissions, RequestTable, RouterState


@dataclass(frozen=True, slots=True)
class RunContext:
    """Fixed facts of one run, given to a policy before the first decision."""

    workers: int
    slots: int
    requests: RequestTable
    seed: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


class Policy:
    """A routing policy: ``route(state)`` returns the admissions for one step.

    ``route`` must be maximal (admit ``state.admissions_due`` requests) unless ``maximal`` is
    false (a KV capacity may leave slots free), respect free slots and never admit a request
    twice; the simulator checks every decision. A policy declares its capabilities: whether it
    projects loads with a completion estimator (``takes_estimator``), the dataclass of its
    options (``options``, None when it has none), and whether it chooses among the waiting
    requests, so that a step's arrivals and finishes decided together help it (``batches``: the
    gateway's step timing holds decisions only for such a policy). Hooks default to nothing.
    """

    name: ClassVar[str] = ""
    takes_estimator: ClassVar[bool] = False
    batches: ClassVar[bool] = False
    options: ClassVar[type | None] = None
    maximal: bool = True

    def reset(self, ctx: RunContext) -> None:
        """Start a new run (clear per-run state, seed randomness)."""
        self.ctx = ctx

    def route(self, state: RouterState) -> Admissions:  # pragma: no cover - interface
        raise NotImplementedError

    def on_complete(
        self, positions: np.ndarray, output_tokens: np.ndarray, finish_s: float, iteration: int
    ) -> None:
        """Requests that left at the start of ``iteration``; their output lengths are now known."""

    def background(self, iteration: int) -> None:
        """Work off the routing path (a twin's replays), after completions; not timed as a
        routing step."""

    def run_stats(self) -> dict[str, Any]:
        """Counters of the run so far, merged into its summary (none by default)."""
        return {}

    def describe(self) -> dict[str, Any]:
        """Resolved configuration, recorded next to every result."""
        return {"name": self.name}

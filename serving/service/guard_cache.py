"""The do-no-harm guard across ``/v1/route`` calls: one guard per (arm, policy).

A routing call builds a fresh policy (no state leaks between callers), but the guard learns
across calls: it lives here, one per model arm and policy name (a bounded set), and is handed
to each call's policy. The service sees completions as running requests that leave: a request
id posted running in one call and absent from the next is taken to have finished at the later
call's ``iteration`` (exact when the dispatcher calls every iteration). Only the ids of the last
call are kept, so memory is bounded by the running requests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.router.policies.balance_config import BalanceRouteConfig
from balanceroute.router.policies.guard import ProjectionGuard
from balanceroute.serving.service.route_schemas import RouteRequest


@dataclass(slots=True)
class _Tracked:
    guard: ProjectionGuard
    shape: tuple[int, int]
    running: dict[Any, tuple[int, int, int]] = field(default_factory=dict)


class RouteGuards:
    """The guards of the service's ``/v1/route`` calls, by ``(arm, policy)``."""

    def __init__(self) -> None:
        self._tracked: dict[tuple[str, str], _Tracked] = {}

    def for_call(
        self, arm: str, policy: str, config: BalanceRouteConfig, req: RouteRequest
    ) -> ProjectionGuard:
        """The guard of ``arm`` under ``policy``, told which requests left since the last call
        (created with ``config``'s knobs on first use, or anew when G or H changed)."""
        g, h = len(req.workers), config.horizon
        key = (arm, policy)
        tracked = self._tracked.get(key)
        if tracked is None or tracked.shape != (g, h):
            slots = req.slots or max(len(w.running) + w.free_slots for w in req.workers)
            guard = ProjectionGuard(
                g,
                h,
                g * max(slots, 1),
                stride=config.guard_stride,
                memory=config.guard_memory,
            )
            tracked = self._tracked[key] = _Tracked(guard, (g, h))
        k = req.iteration
        now = {
            r.id: (worker, r.prompt_tokens, k - r.age)
            for worker, w in enumerate(req.workers)
            for r in w.running
        }
        gone = [v for rid, v in tracked.running.items() if rid not in now]
        if gone:
            left = np.array(gone, dtype=np.int64)
            tracked.guard.departed(k, left[:, 0], left[:, 1], left[:, 2])
        tracked.running = now
        return tracked.guard

    def peek(self, arm: str, policy: str) -> ProjectionGuard | None:
        """The guard of ``arm`` under ``policy`` if one was created."""
        tracked = self._tracked.get((arm, policy))
        return None if tracked is None else tracked.guard

    def drop(self, arm: str) -> None:
        """Forget an arm's guards (its model changed: the verdict was about the old one)."""
        for key in [k for k in self._tracked if k[0] == arm]:
            del self._tracked[key]

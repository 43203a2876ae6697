"""A policy that replays given admissions: request ``i`` joins worker ``w[i]`` at iteration ``x[i]``.

It makes the simulator re-run what a live system (the engine emulator) did, so the two can be
compared iteration by iteration. It is not maximal (a live rank with its own queue may leave
another rank's slots free) and is deliberately not in the router registry.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.state import Admissions, RouterState


class ScriptedPolicy(Policy):
    """Admit request positions at the iterations and to the workers given up front."""

    name = "scripted"
    maximal = False

    def __init__(self, admit_iter: np.ndarray, worker: np.ndarray) -> None:
        self.admit_iter = np.asarray(admit_iter, dtype=np.int64)
        self.worker = np.asarray(worker, dtype=np.int64)
        if self.admit_iter.shape != self.worker.shape:
            raise ValueError("admit_iter and worker differ in length")

    def reset(self, ctx: RunContext) -> None:
        """Index the script by iteration (positions in release order, as the simulator uses)."""
        super().reset(ctx)
        if self.admit_iter.shape[0] != ctx.requests.size:
            raise ValueError(
                f"script has {self.admit_iter.shape[0]} requests, the run {ctx.requests.size}"
            )
        order = np.argsort(self.admit_iter, kind="stable")
        iters = self.admit_iter[order]
        cut = np.flatnonzero(np.diff(iters)) + 1
        self._by_iter: dict[int, tuple[np.ndarray, np.ndarray]] = {
            int(iters[s]): (pos, self.worker[pos])
            for s, pos in zip(np.concatenate(([0], cut)), np.split(order, cut), strict=True)
            if pos.size
        }

    def route(self, state: RouterState) -> Admissions:
        """The admissions scripted for ``state.iteration`` (none if nothing is scripted)."""
        found = self._by_iter.get(state.iteration)
        if found is None:
            return Admissions.empty()
        return Admissions(found[0], found[1])

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "requests": int(self.admit_iter.shape[0])}

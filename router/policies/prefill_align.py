"""Colocated prefill: admissions held until every rank can take one, so the ranks compute their
new prompts in the same steps.

A group whose ranks also prefill stalls every rank while any one computes a prompt chunk
(``router/lab/cost.py``). Admitted one rank at a time, as slots free, prompts are computed in
separate steps and the group pays each stall; held while some rank is full (at most ``wait``
iterations), the prompts share steps. Off (``wait`` 0) for a decode tier behind a
prefill tier, where prompts arrive computed and a held slot only idles (docs/results.md, "A real
lockstep group").
"""

from __future__ import annotations

from balanceroute.router.policies.state import RouterState


class PrefillAlign:
    """Whether a decision holds its admissions; one per policy run of ``slots`` per rank."""

    def __init__(self, wait: int, slots: int) -> None:
        self.wait = wait
        self.slots = slots
        self.since: int | None = None  # the iteration the held admissions first waited at

    def holds(self, state: RouterState) -> bool:
        """True while admissions are due, some rank is full and they have waited fewer than
        ``wait`` iterations; the wait restarts once they are admitted. A rank out of rotation
        (no free slot, not full) is not waited for."""
        if state.admissions_due == 0 or not bool((state.active >= self.slots).any()):
            self.since = None
            return False
        if self.since is None:
            self.since = state.iteration
        if state.iteration - self.since < self.wait:
            return True
        self.since = None
        return False

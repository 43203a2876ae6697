"""When the gateway decides: at once, or just before the group's next step ends.

A synchronized group takes new requests only between steps, so a request decided during a step
joins at the next step whenever it is decided within the step. Deciding each arrival alone (at
once) gives BR-H one request to place at a time; deciding the arrivals and finishes a step brings
together, just before the step ends, gives it the whole burst, as the simulator does
(docs/results.md, "Why bursts broke parity"). The step's end comes from the phase of the tokens
the gateway hears (:class:`~.clock.StepPhase`); the margin before it from the lags the decider
measures (:class:`StepMargin`). Below half the group's slots taken, while the phase is unknown,
or for a first-come policy (``count-jsq``: a batch gives it nothing, and held it can miss a
step; docs/results.md, "Live parity"), a decision is made at once.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from enum import Enum

import numpy as np

from balanceroute.serving.gateway.state import LiveGroup

# the step timing applies while at least this share of the group's slots is taken: where
# placement decides the imbalance; below it (low load) an arrival is decided at once
HOLD_FROM = 0.5
INTAKE_S = 0.001  # the engine's intake of a request, beyond what the gateway can measure
FIRST_MARGIN_S = 0.010  # the margin until enough lags are measured
MIN_SAMPLES = 16  # lags of each kind before the measured margin replaces the first one
LAG_SAMPLES = 512  # the newest lags of each kind the margin is taken from
MAX_SHARE = 0.5  # the margin is at most this share of the step period


class When(Enum):
    """When a decision an arrival or a finish asks for is made (module docstring)."""

    NOW = "now"  # at once
    STEP = "step"  # just before the group's next step ends, while it is at least half full


class StepMargin:
    """How long before the step's end a held decision is made: the p90 of each lag it must
    cover, summed, plus the engine's intake. The lags: the decision's trip (its timer's
    lateness, the decision and the forwarding of what it admitted), the event loop's lag (a
    token waits that long to be heard), and how early a step's tokens came against the phase's
    prediction."""

    KINDS = ("forward", "loop", "early")

    def __init__(self) -> None:
        self.lags = {k: deque[float](maxlen=LAG_SAMPLES) for k in self.KINDS}
        self.value = FIRST_MARGIN_S
        self._new = 0

    def record(self, kind: str, seconds: float) -> None:
        """One lag of ``kind`` (negative ones count as 0); the margin is refreshed every
        :data:`MIN_SAMPLES` lags."""
        self.lags[kind].append(max(seconds, 0.0))
        self._new += 1
        if self._new >= MIN_SAMPLES:
            self._new = 0
            self.refresh()

    def refresh(self) -> None:
        """The margin from the lags, once each kind has :data:`MIN_SAMPLES`."""
        if all(len(v) >= MIN_SAMPLES for v in self.lags.values()):
            p90 = [float(np.quantile(np.fromiter(v, float), 0.9)) for v in self.lags.values()]
            self.value = INTAKE_S + sum(p90)

    def snapshot(self) -> dict[str, float | None]:
        """The margin and each lag's p90, in ms (None: none measured yet), for ``/v1/ab``."""
        out: dict[str, float | None] = {"margin_ms": self.value * 1e3}
        for k, v in self.lags.items():
            out[f"{k}_p90_ms"] = float(np.quantile(np.fromiter(v, float), 0.9)) * 1e3 if v else None
        return out


class Timing:
    """When a decision is made (:class:`When`); one per dispatcher."""

    def __init__(
        self, group: LiveGroup, clock: Callable[[], float], when: When = When.STEP
    ) -> None:
        self.when = when
        self.group = group
        self.clock = clock
        self.margin = StepMargin()
        self._due_at: float | None = None  # the held decision's time, while one is held
        self._decide: Callable[[], object] = lambda: None
        if when is When.STEP:
            group.watch_step(lambda s: self.margin.record("early", s))

    @property
    def held(self) -> bool:
        """Whether a held decision is pending."""
        return self._due_at is not None

    @property
    def until(self) -> float | None:
        """The held decision's time (None: none is held)."""
        return self._due_at

    def holds(self, decide: Callable[[], object], batches: bool = True) -> bool:
        """Whether the decision asked for now waits for the held one, which ``decide`` makes: one
        is held already, or the policy ``batches`` (:attr:`Policy.batches`), the group steps at
        least half full and its phase is known (this ask sets the held decision's time)."""
        if self._due_at is not None:
            return True
        group = self.group
        if self.when is When.NOW or not batches:
            return False
        if group.running_total < HOLD_FROM * group.ranks * group.slots:
            return False
        now = self.clock()
        margin = min(self.margin.value, MAX_SHARE * group.step_period())
        due = group.next_step(now + margin)
        if due is None:
            return False
        self._decide = decide
        self._due_at = max(due - margin, now)
        asyncio.get_running_loop().call_later(self._due_at - now, self.due)
        return True

    def due(self) -> None:
        """The held decision (its timer calls it); the lag until what it admitted was
        forwarded is measured when the event loop comes back to it."""
        at, self._due_at = self._due_at, None
        self._decide()
        if at is not None:
            asyncio.get_running_loop().call_soon(self._forwarded, at)

    def _forwarded(self, at: float) -> None:
        self.margin.record("forward", self.clock() - at)

    def loop_lag(self, seconds: float) -> None:
        """How late the event loop ran a timer (the dispatcher's sample)."""
        if self.when is When.STEP:
            self.margin.record("loop", seconds)

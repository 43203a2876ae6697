"""When the gateway decides (``--decide``): by default, while the group is at least half full
and its step phase is known, the arrivals and finishes of one engine step are held and decided
together just before the step ends, the margin from the measured lags; into an emptier group,
with the phase unknown, with ``--decide now``, or for a policy that places the pool's head one
request at a time (``count-jsq``), an arrival is decided at once (docs/results.md, "Live
parity")."""

from __future__ import annotations

import asyncio

import pytest

from balanceroute.router.lab.switchback import Switchback
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.gateway.clock import ClockedGroup
from balanceroute.serving.gateway.dispatch import Dispatcher
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.timing import (
    FIRST_MARGIN_S,
    INTAKE_S,
    MIN_SAMPLES,
    StepMargin,
    When,
)


class Counted(Dispatcher):
    """A dispatcher (``br0`` unless ``router``) that counts its decisions and the admissions of
    each."""

    def __init__(self, group: LiveGroup, when: When = When.STEP, clock=None,
                 router: str = "br0") -> None:  # fmt: skip
        spec = RouterSpec.parse(router)
        arm = Arm(router, spec, spec.build_policy(None), None)
        sb = Switchback([arm.label], 1e9, 0.0, 0, 0.0)
        more = {} if clock is None else {"clock": clock}
        super().__init__(group, [arm], sb, GatewayMetrics(), when=when, **more)
        self.admitted: list[int] = []

    def decide(self, now: float | None = None) -> int:
        n = super().decide(now)
        self.admitted.append(n)
        return n


def _running(group: LiveGroup, d: Dispatcher, n: int) -> list[int]:
    """``n`` requests admitted and running on the group."""
    out = []
    for key in range(n):
        p = group.arrive(100, 100 + key, 0.0)
        d.waiter(p)
        out.append(p)
    d.decide()
    assert group.inflight.sum() == n
    return out


def _stepping(now: list[float], when: When = When.STEP, margin: float = 0.005,
              busy: int = 4, router: str = "br0") -> tuple[ClockedGroup, Counted]:  # fmt: skip
    """A clocked group of 2 x 4 slots with ``busy`` running, whose steps' tokens came at 0.96
    and 1.0 (steps of 0.04 s), its dispatcher deciding ``margin`` before the next step."""
    group = ClockedGroup.sized(2, 4, 16)
    group.attach(lambda: now[0])
    d = Counted(group, when, clock=lambda: now[0], router=router)
    d.timing.margin.value = margin
    _running(group, d, busy)
    d.admitted.clear()
    for t in (0.96, 1.0):
        group.phase.observe(t)
    return group, d


def test_a_steps_asks_are_decided_together_just_before_it_ends() -> None:
    """The arrivals and the finish heard during a step are held until the margin before its
    tokens are due (1.04 - 0.005), then decided in one decision; an ask closer to the step's end
    than the margin waits for the next step's (its request could not join this step anyway)."""

    async def scenario() -> None:
        now = [1.01]
        group, d = _stepping(now)
        first = int(group.running().position[0])
        futs = []
        for t, key in ((1.01, 2), (1.03, 3)):
            now[0] = t
            futs.append(d.waiter(group.arrive(10 * key, key, t)))
            d.arrived()
        assert d.timing.until == pytest.approx(1.035)
        group.leave(first, 5, learn=True)
        d.wake()
        assert d.admitted == [] and not any(f.done() for f in futs)
        now[0] = 1.035
        d.timing.due()
        assert d.admitted == [2] and all(f.done() for f in futs)
        now[0] = 1.037  # 3 ms before the step's tokens: too late for it
        d.waiter(group.arrive(40, 4, now[0]))
        d.arrived()
        assert d.timing.until == pytest.approx(1.075) and d.admitted == [2]

    asyncio.run(scenario())


def test_a_burst_into_a_stepping_group_is_one_decision_on_the_event_loop() -> None:
    """Half the slots taken; three arrivals and a finish: none is decided before the held
    decision's timer fires, then one decision admits all three; the lag until they were
    forwarded is measured."""

    async def scenario() -> None:
        group = ClockedGroup.sized(2, 4, 16)
        loop = asyncio.get_running_loop()
        group.attach(loop.time)
        d = Counted(group, clock=loop.time)
        first = _running(group, d, 4)[0]
        d.admitted.clear()
        t0 = loop.time()
        for t in (t0 - 0.04, t0):
            group.phase.observe(t)
        futs = []
        for key in (2, 3, 4):
            futs.append(d.waiter(group.arrive(10 * key, key, loop.time())))
            d.arrived()
        group.leave(first, 5, learn=True)
        d.wake()
        assert d.admitted == [] and not any(f.done() for f in futs) and d.timing.held
        ranks = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert d.admitted == [3] and sorted(ranks) == [0, 0, 1]
        await asyncio.sleep(0)
        assert len(d.timing.margin.lags["forward"]) == 1

    asyncio.run(scenario())


def test_decided_at_once_below_half_full_without_a_phase_with_now_or_one_at_a_time() -> None:
    """Three of eight slots taken, the phase unknown, ``--decide now``, or a policy that places
    the pool's head one request at a time (``count-jsq``): the arrival is admitted before
    ``arrived`` returns; ``br0`` in the same group holds it."""

    async def scenario() -> None:
        now = [1.01]
        cases = ((When.STEP, 3, True, "br0"), (When.STEP, 4, False, "br0"),
                 (When.NOW, 4, True, "br0"), (When.STEP, 4, True, "count-jsq"))  # fmt: skip
        for when, busy, phase, router in cases:
            group, d = _stepping(now, when, busy=busy, router=router)
            if not phase:
                group.phase.period = float("nan")
            fut = d.waiter(group.arrive(100, 9, now[0]))
            d.arrived()
            assert fut.done() and group.pool.size == 0 and not d.timing.held
        group, d = _stepping(now, When.STEP, busy=4, router="br0")
        fut = d.waiter(group.arrive(100, 9, now[0]))
        d.arrived()
        assert not fut.done() and d.timing.held

    asyncio.run(scenario())


def test_the_margin_is_the_lags_p90s_and_at_most_half_a_step() -> None:
    """The first margin holds until every kind of lag has :data:`MIN_SAMPLES`; then it is the
    sum of their p90s plus the engine's intake; a margin over half the step period is cut to it."""
    m = StepMargin()
    for i in range(MIN_SAMPLES):
        m.record("forward", 0.001 * (i + 1))
        m.record("loop", 0.002)
    assert m.value == FIRST_MARGIN_S  # no "early" lag yet
    for _ in range(MIN_SAMPLES):
        m.record("early", -0.004)  # a cluster later than predicted counts as 0
    p90_forward = 0.001 * (1 + 0.9 * (MIN_SAMPLES - 1))
    assert m.value == pytest.approx(INTAKE_S + p90_forward + 0.002)
    assert m.snapshot()["early_p90_ms"] == 0.0

    async def scenario() -> None:
        now = [1.01]
        _, d = _stepping(now, margin=0.03)  # over half the 0.04 s step
        d.waiter(d.group.arrive(10, 5, now[0]))
        d.arrived()
        assert d.timing.until == pytest.approx(1.04 - 0.02)

    asyncio.run(scenario())


def test_the_phase_reports_how_early_each_step_came() -> None:
    """Each cluster after the period is known is told against its prediction (positive: early)."""
    group = ClockedGroup.sized(2, 4, 16)
    early: list[float] = []
    group.watch_step(early.append)
    for t in (0.96, 1.0, 1.038, 1.081):
        group.phase.observe(t)
    assert early[-2:] == [pytest.approx(0.002), pytest.approx(-0.003, abs=1e-3)]


def test_the_decide_setting_defaults_to_step() -> None:
    """``decide`` is ``step`` unless set; anything but ``step`` or ``now`` is refused."""
    ranks = ["http://127.0.0.1:9"]
    assert GatewaySettings(ranks=ranks, slots=2).decide == "step"
    assert GatewaySettings(ranks=ranks, slots=2, decide="now").decide == "now"
    with pytest.raises(ValueError, match="decide"):
        GatewaySettings(ranks=ranks, slots=2, decide="hold")

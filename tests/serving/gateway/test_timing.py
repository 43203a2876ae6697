"""The decision hold (``--hold``): while the group is at least half full, a burst of arrivals and
the finishes that come during the hold are decided together in one decision; into an emptier
group, or with no hold, an arrival is decided at once (docs/results.md, "Why bursts broke parity,
and what the holds do")."""

from __future__ import annotations

import asyncio

import pytest

from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.gateway.clock import ClockedGroup
from balanceroute.serving.gateway.dispatch import Dispatcher
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.switchback import Switchback


class Counted(Dispatcher):
    """A ``count-jsq`` dispatcher that counts its decisions and the admissions of each."""

    def __init__(self, group: LiveGroup, hold_s: float, quiet_s: float = 0.0, clock=None,
                 step_s: float = 0.0) -> None:  # fmt: skip
        spec = RouterSpec.parse("count-jsq")
        arm = Arm("count-jsq", spec, spec.build_policy(None), None)
        sb = Switchback([arm.label], 1e9, 0.0, 0, 0.0)
        more = {} if clock is None else {"clock": clock}
        super().__init__(group, [arm], sb, GatewayMetrics(), hold_s=hold_s, quiet_s=quiet_s,
                         step_s=step_s, **more)  # fmt: skip
        self.admitted: list[int] = []

    def decide(self) -> int:
        n = super().decide()
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


def test_a_burst_into_a_stepping_group_is_one_decision() -> None:
    """Half the slots taken; three arrivals and a finish during the hold: none is decided before
    it ends, then one decision admits all three (the finish told to the policy first)."""

    async def scenario() -> None:
        group = LiveGroup.sized(ranks=2, slots=4, max_pool=8)
        d = Counted(group, hold_s=0.05)
        first = _running(group, d, 4)[0]
        d.admitted.clear()
        futs = []
        for key in (2, 3, 4):
            p = group.arrive(10 * key, key, 0.0)
            futs.append(d.waiter(p))
            d.arrived()
        group.leave(first, 5, learn=True)
        d.wake()
        assert d.admitted == [] and not any(f.done() for f in futs)
        ranks = await asyncio.wait_for(asyncio.gather(*futs), 30)
        assert d.admitted == [3] and sorted(ranks) == [0, 0, 1]
        assert group.pool.size == 0 and group.departures == []

    asyncio.run(scenario())


def test_a_group_under_half_full_or_no_hold_decides_at_once() -> None:
    """Nothing or three of eight slots run: the hold does not apply, the arrival is admitted
    before ``arrived`` returns; with no hold a request arriving into a half-full group is too."""

    async def scenario() -> None:
        for hold, busy in ((0.05, 0), (0.05, 3), (0.0, 4)):
            group = LiveGroup.sized(ranks=2, slots=4, max_pool=8)
            d = Counted(group, hold_s=hold)
            if busy:
                _running(group, d, busy)
            p = group.arrive(100, 9, 0.0)
            fut = d.waiter(p)
            d.arrived()
            assert fut.done() and group.pool.size == 0

    asyncio.run(scenario())


def test_the_hold_setting_defaults_to_off_and_is_bounded() -> None:
    """``hold_s`` is 0 (decide at once) unless set; it must lie in [0, 1] s."""
    ranks = ["http://127.0.0.1:9"]
    assert GatewaySettings(ranks=ranks, slots=2).hold_s == 0.0
    assert GatewaySettings(ranks=ranks, slots=2, hold_s=0.015).hold_s == 0.015
    for bad in (-0.001, 2.0):
        with pytest.raises(ValueError, match="hold_s"):
            GatewaySettings(ranks=ranks, slots=2, hold_s=bad)


def _half_full(now: list[float], hold_s: float) -> tuple[LiveGroup, Counted]:
    """A half-full group of 2 x 4 slots and its dispatcher with a 0.02 s quiet hold on the
    test's clock ``now[0]``."""
    group = LiveGroup.sized(ranks=2, slots=4, max_pool=16)
    d = Counted(group, hold_s=hold_s, quiet_s=0.02, clock=lambda: now[0])
    _running(group, d, 4)
    d.admitted.clear()
    return group, d


def test_a_quiet_hold_decides_once_nothing_asked_for_the_quiet_time() -> None:
    """``quiet_s``: the held decision comes once nothing has asked for ``quiet_s``, not at the
    hold's end; an ask during the quiet time puts it off, and the burst is still one decision
    (the dispatcher's clock is the test's, so no wall time is asserted)."""

    async def scenario() -> None:
        now = [0.0]
        group, d = _half_full(now, hold_s=1.0)
        futs = []
        for t, key in ((0.0, 2), (0.015, 3)):  # the second ask within the first's quiet time
            now[0] = t
            p = group.arrive(10 * key, key, t)
            futs.append(d.waiter(p))
            d.arrived()
        now[0] = 0.025  # 0.02 after the first ask, 0.01 after the second: still held
        d.timing.due()
        assert d.admitted == [] and not any(f.done() for f in futs)
        now[0] = 0.04  # quiet for 0.025 > 0.02, far before the hold's end (1.0)
        d.timing.due()
        assert d.admitted == [2] and all(f.done() for f in futs)
        assert d.timing.until is None

    asyncio.run(scenario())


def test_a_quiet_hold_still_ends_at_the_hold() -> None:
    """Asks that never stop for ``quiet_s`` do not hold the decision past ``hold_s``."""

    async def scenario() -> None:
        now = [0.0]
        group, d = _half_full(now, hold_s=0.05)
        for i in range(6):  # an ask every 0.01 s: never quiet for 0.02
            now[0] = 0.01 * i
            d.waiter(group.arrive(10, 20 + i, now[0]))
            d.arrived()
            d.timing.due()
            assert d.admitted == ([] if i < 5 else [4])  # at 0.05, the hold's end: every free slot
        assert group.pool.size == 2 and d.timing.until is None

    asyncio.run(scenario())


def test_the_quiet_setting_defaults_to_off_and_is_bounded() -> None:
    """``hold_quiet_s`` is 0 (the whole hold) unless set; it must lie in [0, 1] s."""
    ranks = ["http://127.0.0.1:9"]
    assert GatewaySettings(ranks=ranks, slots=2).hold_quiet_s == 0.0
    for bad in (-0.001, 2.0):
        with pytest.raises(ValueError, match="hold_quiet_s"):
            GatewaySettings(ranks=ranks, slots=2, hold_s=0.03, hold_quiet_s=bad)


def test_a_burst_into_a_filling_group_is_held_after_its_first_request() -> None:
    """With ``quiet_s``, into an empty group: a lone arrival is decided at once (low-load TTFT
    untouched); the next ones within ``quiet_s`` of their predecessor are a burst, held and
    decided together once quiet; an arrival after a quiet gap is alone again."""

    async def scenario() -> None:
        now = [0.0]
        group = LiveGroup.sized(ranks=2, slots=4, max_pool=8)
        d = Counted(group, hold_s=0.05, quiet_s=0.005, clock=lambda: now[0])

        def arrive(t: float, key: int) -> asyncio.Future[int]:
            now[0] = t
            fut = d.waiter(group.arrive(10 * key, key, t))
            d.arrived()
            return fut

        assert arrive(1.0, 1).done() and d.admitted == [1]
        burst = [arrive(1.002, 2), arrive(1.004, 3)]
        assert not any(f.done() for f in burst) and d.admitted == [1]
        now[0] = 1.0095  # 5.5 ms after the burst's last arrival
        d.timing.due()
        assert all(f.done() for f in burst) and d.admitted == [1, 2]
        assert arrive(1.5, 4).done() and d.admitted == [1, 2, 1]

    asyncio.run(scenario())


def _stepping(now: list[float], step_s: float, hold_s: float = 0.0) -> tuple[ClockedGroup, Counted]:
    """A half-full clocked group of 2 x 4 slots whose steps' tokens came at 0.96 and 1.0 (steps
    of 0.04 s), and its dispatcher deciding ``step_s`` before the next step, on ``now[0]``."""
    group = ClockedGroup.sized(2, 4, 16)
    group.attach(lambda: now[0])
    d = Counted(group, hold_s=hold_s, step_s=step_s, clock=lambda: now[0])
    _running(group, d, 4)
    d.admitted.clear()
    for t in (0.96, 1.0):
        group.phase.observe(t)
    return group, d


def test_a_step_hold_decides_the_steps_asks_together_just_before_it_ends() -> None:
    """``step_s``: the arrivals and the finish heard during a step are held until ``step_s``
    before its tokens are due (1.04 - 0.005), then decided in one decision; an ask closer to
    the step's end than ``step_s`` waits for the next step's (its request could not join this
    step anyway)."""

    async def scenario() -> None:
        now = [1.01]
        group, d = _stepping(now, step_s=0.005)
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


def test_a_step_hold_without_a_phase_falls_back() -> None:
    """While the step phase is unknown, ``step_s`` alone decides at once and with a hold the
    hold applies."""

    async def scenario() -> None:
        now = [1.0]
        for hold in (0.0, 0.03):
            group = ClockedGroup.sized(2, 4, 16)
            group.attach(lambda: now[0])
            d = Counted(group, hold_s=hold, step_s=0.005, clock=lambda: now[0])
            _running(group, d, 4)
            d.admitted.clear()
            fut = d.waiter(group.arrive(10, 9, now[0]))
            d.arrived()
            assert fut.done() == (hold == 0.0)
            assert d.timing.until == (None if hold == 0.0 else pytest.approx(1.03))

    asyncio.run(scenario())


def test_the_step_setting_defaults_to_off_and_is_bounded() -> None:
    """``hold_step_s`` is 0 (off) unless set; it must lie in [0, 1] s."""
    ranks = ["http://127.0.0.1:9"]
    assert GatewaySettings(ranks=ranks, slots=2).hold_step_s == 0.0
    assert GatewaySettings(ranks=ranks, slots=2, hold_step_s=0.005).hold_step_s == 0.005
    for bad in (-0.001, 2.0):
        with pytest.raises(ValueError, match="hold_step_s"):
            GatewaySettings(ranks=ranks, slots=2, hold_step_s=bad)

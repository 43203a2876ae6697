"""The decision hold (``--hold``): while the group is at least half full, a burst of arrivals and
the finishes that come during the hold are decided together in one decision; into an emptier
group, or with no hold, an arrival is decided at once (docs/results.md, "Why BR-H's live imbalance on Mooncake was
4x the simulator's")."""

from __future__ import annotations

import asyncio

import pytest

from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.gateway.dispatch import Dispatcher
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.switchback import Switchback


class Counted(Dispatcher):
    """A ``count-jsq`` dispatcher that counts its decisions and the admissions of each."""

    def __init__(self, group: LiveGroup, hold_s: float) -> None:
        spec = RouterSpec.parse("count-jsq")
        arm = Arm("count-jsq", spec, spec.build_policy(None), None)
        sb = Switchback([arm.label], 1e9, 0.0, 0, 0.0)
        super().__init__(group, [arm], sb, GatewayMetrics(), hold_s=hold_s)
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

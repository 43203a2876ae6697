"""The decision loop does only what the state asks for (issue 20, the gateway's cost): no decision
and no sample between two regular samples while nothing waits, a decision and a row every tick
while requests wait, the step estimate kept by pulses, and the deadlines that do not depend on the
tick (``--no-rank-wait``) still fire; health checks skip the ranks that are visibly serving, and
the step counters of idle ranks are not read."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from balanceroute.router.lab.switchback import Switchback
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.gateway.clock import ClockedGroup, EngineCounters
from balanceroute.serving.gateway.decider import Decider, Rejected, admitted, arrive
from balanceroute.serving.gateway.dispatch import Dispatcher
from balanceroute.serving.gateway.health import RankHealth
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.upstream import RankPool
from tests.poll import until_async


class Counted(Dispatcher):
    """A dispatcher that counts its decisions and the switchback's samples."""

    def __init__(self, group: LiveGroup, **kw) -> None:
        spec = RouterSpec.parse("count-jsq")
        arm = Arm("count-jsq", spec, spec.build_policy(None), None)
        sb = Switchback([arm.label], 1e9, 0.0, 0, 0.0)
        super().__init__(group, [arm], sb, GatewayMetrics(), **kw)
        self.decisions = 0
        self.sb_samples = 0
        real = sb.sample

        def sample(imbalance: float, now: float) -> None:
            self.sb_samples += 1
            real(imbalance, now)

        sb.sample = sample  # type: ignore[method-assign]

    def decide(self, now: float | None = None) -> int:
        self.decisions += 1
        return super().decide(now)


def test_a_quiet_loop_sleeps_until_an_arrival_wakes_it() -> None:
    """Nothing waits or runs: over many ticks' time the loop makes no decision and only its first
    regular sample; an arrival wakes it and is admitted at once."""

    async def scenario() -> None:
        group = LiveGroup.sized(ranks=2, slots=1, max_pool=8)
        d = Counted(group)
        loop = asyncio.get_running_loop().create_task(d.run(0.001, 3600.0))
        try:
            await until_async(lambda: len(d.ticks) == 1, what="the first sample")
            await asyncio.sleep(0.2)  # two hundred ticks' time
            assert d.decisions == 0 and len(d.ticks) == 1 and d.sb_samples == 1
            p = group.arrive(100, 1, d.clock())
            fut = d.waiter(p)
            d.wake()
            assert await asyncio.wait_for(fut, 30) in (0, 1)
            assert group.pool.size == 0 and d.decisions >= 1
        finally:
            loop.cancel()

    asyncio.run(scenario())


def test_while_requests_wait_every_tick_decides_and_keeps_a_row() -> None:
    """A request waits behind a full group: each tick decides and adds a row to ticks.parquet's
    samples, but the switchback hears only the regular samples (even in time); the slot freed
    by a finish admits it."""
    async def scenario() -> None:
        group = LiveGroup.sized(ranks=1, slots=1, max_pool=8)
        d = Counted(group, clock=lambda: 0.0)
        first = group.arrive(100, 1, 0.0)
        d.waiter(first)
        d.decide()
        second = group.arrive(50, 2, 0.0)
        fut = d.waiter(second)
        decisions = d.decisions
        regular = [d.tick(now, next_sample=5.0) for now in (1.0, 2.0, 3.0, 5.0)]
        assert regular == [False, False, False, True]
        assert d.decisions == decisions + 4
        assert len(d.ticks) == 4 and [r[1] for r in d.ticks] == [1, 1, 1, 1]  # the pool
        assert d.sb_samples == 1
        group.leave(first, 10, learn=True)
        d.tick(6.0, next_sample=math.inf)
        assert fut.result() == 0 and group.pool.size == 0
        assert len(d.ticks) == 5 and d.ticks[-1][1] == 0  # the pass that emptied the pool
        d.tick(7.0, next_sample=math.inf)
        assert len(d.ticks) == 5  # nothing waits and no sample is due: no row

    asyncio.run(scenario())


def test_the_regular_sample_is_sparse_unless_arms_alternate() -> None:
    """Each regular sample wakes the gateway: by default once a second, ten times a second while
    arms alternate (the switchback's imbalance average); ``--sample`` sets it either way."""
    ranks = ["http://127.0.0.1:9000"]
    assert GatewaySettings(ranks=ranks, slots=4).sample_every(switching=False) == 1.0
    assert GatewaySettings(ranks=ranks, slots=4).sample_every(switching=True) == 0.1
    chosen = GatewaySettings(ranks=ranks, slots=4, sample_s=0.25)
    assert chosen.sample_every(switching=False) == chosen.sample_every(switching=True) == 0.25


def test_running_requests_keep_the_step_estimate_without_decisions() -> None:
    """Requests run, none waits: a tick makes no decision; each tick with new tokens counts one
    iteration (as a decision would), and one without counts none."""
    async def scenario() -> None:
        group = LiveGroup.sized(ranks=2, slots=2, max_pool=8)
        d = Counted(group, clock=lambda: 0.0)
        p = group.arrive(100, 1, 0.0)
        d.waiter(p)
        d.decide()
        assert group.needs_tick()
        decisions, start = d.decisions, group.iteration
        for k in range(1, 6):
            group.advance(p, k)
            d.tick(float(k), next_sample=math.inf)
        d.tick(6.0, next_sample=math.inf)  # no token since the last tick
        assert d.decisions == decisions and group.iteration == start + 5
        assert len(d.ticks) == 0  # no sample was due

    asyncio.run(scenario())


def test_a_clocked_group_needs_no_tick_and_an_arrival_reads_its_clock() -> None:
    """The ranks' clocks count steps by time: no tick is needed while requests run, and a request
    arriving after a quiet spell has its wait counted from the clocks' count then, not from the
    last decision's."""
    now = [0.0]
    group = ClockedGroup.sized(2, 4, 8)
    group.attach(lambda: now[0])
    group.clock.set_periods(0.01)  # 10 ms iterations on both ranks
    p = group.arrive(100, 1, 0.0)
    group.start(p, 0)
    assert not group.needs_tick()
    now[0] = 2.0  # 200 iterations later, no decision in between
    q = group.arrive(100, 2, 2.0)
    assert group.iteration >= 199
    assert group.pool.waited_iterations(np.array([q])).tolist() == [0]


def test_a_queued_request_still_gets_its_503_after_the_no_rank_wait(tmp_path: Path) -> None:
    """The only rank never answers: once the outage has lasted ``--no-rank-wait`` the queued
    request is refused (the deadline is the request's own, not the tick's), and at the stop
    ``OUT/ticks.parquet`` holds the samples, the waiting one among them."""
    from balanceroute.serving.gateway.runtime import build_gateway

    async def scenario() -> None:
        settings = GatewaySettings(ranks=["http://127.0.0.1:9"], slots=1, router="count-jsq",
                                   health_interval_s=0.02, health_fall=1, no_rank_wait_s=0.3,
                                   sample_s=0.05, out=str(tmp_path), track=False)  # fmt: skip
        gw = build_gateway(settings)
        await gw.start()
        try:
            await until_async(lambda: gw.health.outage_since is not None, what="the outage")
            req = arrive(gw, "r", 10, "k", 1, False)
            with pytest.raises(Rejected, match="no-rank-wait"):
                await asyncio.wait_for(admitted(gw, req), 30)
            Decider(gw).leave(req, "no_rank")
        finally:
            await gw.stop()
        ticks = pd.read_parquet(tmp_path / "ticks.parquet")
        assert len(ticks) >= 2 and ticks["pool"].max() == 1 and ticks["pool"].iloc[-1] <= 1

    asyncio.run(scenario())


def test_health_checks_skip_the_ranks_that_serve() -> None:
    """A rank in rotation that streamed since the last round is not probed; a quiet one, one out
    of rotation and one with a failed check pending are."""

    async def scenario() -> None:
        settings = GatewaySettings(ranks=[f"http://127.0.0.1:{9 + g}" for g in range(4)], slots=2)
        group = LiveGroup.sized(4, 2, 8)
        health = RankHealth(settings, group, GatewayMetrics(), lambda: None, RankPool(settings).get)
        probed: list[int] = []

        async def check(rank: int) -> None:
            probed.append(rank)

        health.check = check  # type: ignore[method-assign]
        for g in range(4):
            p = group.arrive(10, g + 1, 0.0)
            group.start(p, g)
            if g != 1:  # rank 1 is quiet
                group.advance(p, 3)
        group.set_healthy(2, False)
        health.fails[3] = 1
        await health.check_all()
        assert sorted(probed) == [1, 2, 3] and health.skipped == 1
        probed.clear()
        await health.check_all()  # nothing heard since: every rank is probed
        assert sorted(probed) == [0, 1, 2, 3]

    asyncio.run(scenario())


def test_idle_ranks_step_counters_are_not_read_and_the_last_read_does_not_pair() -> None:
    """A rank with nothing running is skipped, and its last busy read is marked idle, so the next
    busy read does not make a period over the idle spell."""
    group = ClockedGroup.sized(2, 2, 8)
    group.attach(lambda: 0.0)
    counters = EngineCounters(group, False, 1.0)
    group.clock.engine[0] = (100.0, 1.0, True)
    assert counters.idle(0) and group.clock.engine[0] == (100.0, 1.0, False)
    p = group.arrive(10, 1, 0.0)
    group.start(p, 1)
    assert not counters.idle(1)
    group.clock.engine_count(0, 150.0, 9.0, True)  # 50 steps over 8 s, mostly idle
    assert np.isnan(group.clock.period[0])


def test_a_step_counter_that_moved_counts_as_the_rank_heard() -> None:
    """A busy rank whose engine counted steps since the last read is serving (its health check
    is skipped); one whose counter stood still is not."""
    group = ClockedGroup.sized(2, 2, 8)
    group.attach(lambda: 0.0)
    counters = EngineCounters(group, False, 1.0)
    for g in range(2):
        group.start(group.arrive(10, g + 1, 0.0), g)
    page = "vllm:iteration_tokens_total_count {} {}\n"
    assert counters.read(0, page.format("", 100), 1.0) and counters.read(1, page.format("", 7), 1.0)
    assert group.heard.tolist() == [0, 0]  # a first read pairs with nothing
    counters.read(0, page.format("", 124), 2.0)
    counters.read(1, page.format("", 7), 2.0)
    assert group.heard.tolist() == [1, 0]


def test_a_lone_arrival_is_decided_at_once_and_a_crowd_at_the_next_pass() -> None:
    """An arrival that waits alone with a slot free is admitted before ``arrived`` returns (its
    first token waits for no event-loop pass); one behind a full group waits for the next
    decision, and the loop's next pass makes it."""

    async def scenario() -> None:
        group = LiveGroup.sized(ranks=1, slots=1, max_pool=8)
        d = Counted(group)
        p = group.arrive(100, 1, d.clock())
        fut = d.waiter(p)
        d.arrived()
        assert fut.done() and fut.result() == 0 and d.decisions == 1
        q = group.arrive(100, 2, d.clock())
        later = d.waiter(q)
        d.arrived()  # the only slot is taken: no decision now
        assert not later.done() and d.decisions == 1
        group.leave(p, 5, learn=True)
        d.wake()
        await asyncio.sleep(0)
        assert later.done() and d.decisions == 2

    asyncio.run(scenario())


def test_a_check_that_timed_out_while_the_gateway_stalled_is_not_counted(monkeypatch) -> None:
    """A real rank that never answers: a timeout on time counts against it; one that fired late
    because the gateway's own loop was blocked is not judged (a stalled gateway must not empty
    its rotation when it wakes)."""
    import time as wall

    from balanceroute.serving.gateway import health as health_module

    monkeypatch.setattr(health_module, "CHECK_TIMEOUT_S", 0.3)

    async def scenario() -> None:
        async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            await reader.read(1 << 16)
            await asyncio.sleep(30)  # never answers within a check

        server = await asyncio.start_server(silent, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        settings = GatewaySettings(ranks=[f"http://127.0.0.1:{port}"], slots=2)
        pool = RankPool(settings)
        health = RankHealth(settings, LiveGroup.sized(1, 2, 8), GatewayMetrics(), lambda: None,
                            pool.get)  # fmt: skip
        try:
            await health.check(0)  # the loop ran on time: a real timeout
            assert health.fails[0] == 1 and health.unjudged == 0
            task = asyncio.create_task(health.check(0))
            await asyncio.sleep(0.1)  # the request is on the wire
            wall.sleep(0.3 + 2 * health_module.LATE_LOOP_S + 0.3)  # the loop is blocked
            await task
            assert health.fails[0] == 1 and health.unjudged == 1
            assert bool(health.group.healthy[0])
        finally:
            pool.close()
            server.close()
            await server.wait_closed()

    asyncio.run(scenario())

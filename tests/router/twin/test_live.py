"""The twin live: finished requests numbered in arrival order (property), the worker's budget,
memory bounded over a long feed, and the counterfactual comparison of arms."""

from __future__ import annotations

import os
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.twin.compare import ArmComparison, ComparedArm
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.feed import ArrivalOrder, TwinFeed
from balanceroute.router.lab.twin.live import MAX_LAG, Channel, LiveTwin, TwinWorker
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.specs import RouterSpec
from tests.router.helpers import frame

G, B, BLOCK = 2, 3, 32
CFG = TwinConfig(block_requests=BLOCK, min_windows=3, cooldown=2, memory=8)


def _estimator() -> SurvivalEstimator:
    rng = np.random.default_rng(7)
    return SurvivalEstimator(horizon=16).fit(
        frame(rng.integers(100, 3000, 300), rng.integers(1, 60, 300))
    )


# ---- numbering ---------------------------------------------------------------------------------
@settings(max_examples=60, deadline=None)
@given(
    fates=st.lists(st.tuples(st.booleans(), st.integers(1, 50)), min_size=1, max_size=60),
    order_seed=st.integers(0, 2**16),
    max_pending=st.integers(1, 80),
)
def test_finished_requests_are_numbered_densely_in_arrival_order(fates, order_seed, max_pending):
    """Whatever order requests finish or drop in, the numbers are dense, in arrival order,
    and hold exactly the finished ones (those not given up to bound memory), with their
    output lengths."""
    feed, order = TwinFeed(), ArrivalOrder(max_pending)
    tickets = [feed.arrived(float(i), 10 + i, i) for i in range(len(fates))]
    rng = np.random.default_rng(order_seed)
    rows = []
    for i in rng.permutation(len(fates)).tolist():
        finished, out = fates[i]
        if finished:
            feed.finished(tickets[i], out, 100.0 + i)
        else:
            feed.dropped(tickets[i])
        got = feed.drain(order)
        if got is not None:
            rows.append(got)
    numbered = [x for r in rows for x in zip(r.index.tolist(), r.prompt_tokens.tolist(),
                                             r.output_tokens.tolist(), strict=True)]  # fmt: skip
    assert [n for n, _, _ in numbered] == list(range(len(numbered)))
    arrivals = [p - 10 for _, p, _ in numbered]
    assert arrivals == sorted(arrivals)
    assert all(fates[a][0] and fates[a][1] == out for a, (_, _, out) in zip(arrivals, numbered,
                                                                            strict=True))  # fmt: skip
    assert len(order.pending) == 0
    assert len(numbered) + order.dropped + order.given_up == len(fates)
    if max_pending >= len(fates):  # nothing given up: every finished request is numbered
        assert arrivals == [i for i, (f, _) in enumerate(fates) if f]


# ---- the live twin ----------------------------------------------------------------------------
def _feed_stream(
    channel: Channel, worker: TwinWorker, n: int, seed: int, tick: bool, step_from: int = 0
):
    """``n`` requests arriving in time, each finishing after its output length (in steps of
    0.05 s); the worker runs a pass after each live iteration (stepping from pass
    ``step_from`` on). Yields after every pass."""
    rng = np.random.default_rng(seed)
    feed = channel.feed
    running: list[tuple[int, int, float]] = []  # (ticket, output, finish time)
    t = 0.0
    for k in range(n):
        t = 0.05 * k
        out = int(rng.integers(1, 40))
        ticket = feed.arrived(t, int(rng.integers(50, 2000)), int(rng.integers(0, 5)))
        if rng.random() < 0.03:
            feed.dropped(ticket)
        else:
            running.append((ticket, out, t + 0.05 * out / 3))
        done = [r for r in running if r[2] <= t]
        running = [r for r in running if r[2] > t]
        for ticket, out, end in done:
            feed.finished(ticket, out, end)
        if tick:
            feed.tick(k)
        worker.run_once(may_step=k >= step_from)
        yield k


def test_memory_stays_bounded_over_a_long_feed_and_the_twin_keeps_deciding():
    worker = TwinWorker()
    channel = worker.channel("x", 16 * BLOCK)
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), G, B)
    channel.add("twin", lambda: LiveTwin(group, _estimator(), CFG))
    peak: dict[str, int] = {}
    for k in _feed_stream(channel, worker, 6000, seed=1, tick=True):
        if k % 50 == 0:
            job = channel.job("twin")
            for name, v in job.memory().items():
                peak[name] = max(peak.get(name, 0), v)
            peak["pending"] = max(peak.get("pending", 0), len(channel.order.pending))
    job = channel.job("twin")
    stats = job.stats()
    assert stats["twin_decisions"] >= 50  # it kept deciding all along
    assert channel.order.numbered >= 5000
    # bounded by blocks, not by the requests seen (about 5,800 numbered)
    assert peak["rows"] <= (MAX_LAG + 2) * BLOCK
    assert peak["flags"] <= 4 * (MAX_LAG + 2) * BLOCK
    assert peak["baseline"] <= MAX_LAG + 2
    assert peak["test_blocks"] <= CFG.memory
    assert peak["shadow_heap"] <= (MAX_LAG + 3) * BLOCK
    assert peak["pending"] <= 16 * BLOCK


def test_a_twin_without_budget_skips_to_recent_blocks_and_stays_bounded():
    """No live iterations reported: no budget, so no step; the twin keeps at most MAX_LAG
    complete blocks and drops the older ones."""
    worker = TwinWorker()
    channel = worker.channel("x", 16 * BLOCK)
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), G, B)
    channel.add("twin", lambda: LiveTwin(group, _estimator(), CFG))
    for _ in _feed_stream(channel, worker, 3000, seed=2, tick=False):
        pass
    job = channel.job("twin")
    stats = job.stats()
    assert stats["twin_decisions"] == 0 and stats["twin_steps"] == 0
    assert stats["twin_lag_blocks"] <= MAX_LAG
    assert stats["twin_blocks_dropped"] > 50
    memory = job.memory()
    assert memory["rows"] <= (MAX_LAG + 2) * BLOCK
    assert memory["shadow_heap"] <= (MAX_LAG + 3) * BLOCK  # learned up to the next block


def test_a_live_twin_starts_where_it_is_told():
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), G, B)
    assert LiveTwin(group, _estimator(), CFG).weight == 0.0
    assert LiveTwin(group, _estimator(), CFG, start=1.0).weight == 1.0
    test = SequentialTest((0.0, 0.5, 1.0), TwinConfig(start_weight=0.5))
    test.decisions = 7
    live = LiveTwin(group, _estimator(), CFG, start=test)
    assert live.weight == 0.5 and live.stats()["twin_decisions"] == 7


# ---- the counterfactual comparison ------------------------------------------------------------
def test_the_comparison_replays_every_arm_on_the_same_blocks():
    worker = TwinWorker()
    channel = worker.channel("x", 16 * BLOCK)
    group = TwinGroup(RouterSpec.parse("brh:none{horizon=16}"), G, B)
    arms = [
        ComparedArm("brh:none", RouterSpec.parse("brh:none{horizon=16}")),
        ComparedArm("same", RouterSpec.parse("brh:none{horizon=16}")),
        ComparedArm("jsq", RouterSpec.parse("count-jsq")),
        ComparedArm(
            "surv", RouterSpec.parse("brh:survival{horizon=16}"), _estimator(), weight=lambda: 1.0
        ),
    ]
    channel.add("cf", lambda: ArmComparison(arms, group, CFG))
    for _ in _feed_stream(channel, worker, 1500, seed=3, tick=True):
        pass
    summary = channel.job("cf").summary()
    assert summary["blocks"] >= 10
    per = summary["imbalance_ratio_vs_reference"]
    assert per["same"]["ratio"] == 1.0 and per["same"]["low"] == per["same"]["high"] == 1.0
    assert per["jsq"]["low"] <= per["jsq"]["ratio"] <= per["jsq"]["high"]
    assert per["surv"]["weight_mean"] == 1.0


def test_a_comparison_without_budget_stays_bounded():
    worker = TwinWorker()
    channel = worker.channel("x", 16 * BLOCK)
    group = TwinGroup(RouterSpec.parse("brh:none{horizon=16}"), G, B)
    arms = [
        ComparedArm("brh:none", RouterSpec.parse("brh:none{horizon=16}")),
        ComparedArm("surv", RouterSpec.parse("brh:survival{horizon=16}"), _estimator()),
    ]
    channel.add("cf", lambda: ArmComparison(arms, group, CFG))
    for _ in _feed_stream(channel, worker, 3000, seed=4, tick=False):
        pass
    cf = channel.job("cf")
    assert cf.summary()["blocks"] == 0 and cf.dropped > 50
    assert cf.count <= 4 * BLOCK
    assert all(len(s.heap) <= 4 * BLOCK for s in cf.shadows)


# ---- the CPU cap ------------------------------------------------------------------------------
def test_the_cpu_cap_holds_steps_until_the_threads_cpu_and_a_step_fit_its_share():
    worker = TwinWorker(cpu_share=0.05)
    channel = worker.channel("x", 16 * BLOCK)
    assert worker.may_step(1e9)  # not started: tests and simulate step freely
    worker.started = 100.0
    worker.cpu_s = 1.0
    channel.step_cpu_s = 0.5  # the costliest step so far is reserved
    assert not worker.may_step(100.0 + 29.9)  # 1.5 s of CPU needs 30 s at 5%
    assert worker.may_step(100.0 + 30.0)
    assert TwinWorker(cpu_share=None).may_step(0.0)


def test_a_capped_worker_feeds_its_twin_but_never_steps_it():
    worker = TwinWorker(cpu_share=0.05)
    channel = worker.channel("x", 16 * BLOCK)
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), G, B)
    channel.add("twin", lambda: LiveTwin(group, _estimator(), CFG))
    for k in _feed_stream(channel, worker, 2100, seed=5, tick=True, step_from=1500):
        if k == 1499:  # capped all along: fed, bounded, never stepped
            stats = channel.job("twin").stats()
            assert stats["twin_steps"] == 0 and channel.order.numbered > 1000
            assert stats["twin_lag_blocks"] <= MAX_LAG
            assert channel.step_cpu_s == 0.0
    assert channel.job("twin").stats()["twin_steps"] > 0  # the cap lifted: it steps
    assert channel.step_cpu_s > 0.0


def test_twin_config_rejects_a_cpu_share_outside_one_core():
    with pytest.raises(ValueError, match="cpu_share"):
        TwinConfig(cpu_share=0.0)
    with pytest.raises(ValueError, match="cpu_share"):
        TwinConfig(cpu_share=1.5)
    assert TwinConfig(cpu_share=None).cpu_share is None


# ---- the thread's OS priority -----------------------------------------------------------------
def _thread_nice(worker: TwinWorker) -> int:
    """The started thread's nice, read once it has set it (``started`` comes after)."""
    worker.start()
    for _ in range(10_000):
        if worker.started is not None:
            break
        threading.Event().wait(0.001)
    assert worker.thread is not None and worker.thread.native_id is not None
    try:
        return os.getpriority(os.PRIO_PROCESS, worker.thread.native_id)
    finally:
        worker.stop()


def test_the_thread_keeps_the_programs_priority_at_nice_0_and_lowers_it_when_asked():
    own = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert _thread_nice(TwinWorker(nice=0)) == own
    assert _thread_nice(TwinWorker(nice=3)) == min(19, own + 3)  # relative to the program's
    assert _thread_nice(TwinWorker(nice=19)) == 19  # raising a nice needs no privilege


def test_a_nice_outside_the_os_range_is_refused():
    with pytest.raises(ValueError, match="nice"):
        TwinWorker(nice=-1)
    with pytest.raises(ValueError, match="nice"):
        TwinWorker(nice=20)

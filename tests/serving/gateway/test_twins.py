"""The gateway's live twins: which arms a twin drives, the weight applied at every decision,
the twin advancing from the requests' lives in a child process (its replays in another PID,
its weights reaching the arm), decisions never waiting for it, a dead child leaving the arms
at w = 0 and restarted, no child left after a stop, and the switchback's verdict beside the
twin's counterfactual."""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import time
from dataclasses import replace

import numpy as np
import pytest
from prometheus_client import generate_latest

from balanceroute.cli import build_parser
from balanceroute.cli.gateway import settings_from_args
from balanceroute.predict.factory import build_estimator
from balanceroute.router.lab.switchback import Switchback, report_markdown, twin_agreement
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.prior import attach_priors
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.arms import Arm, Handle
from balanceroute.serving.gateway.dispatch import Dispatcher
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.twins import COMPARISON, GatewayTwins, local_model, twin_drives
from tests.poll import until
from tests.router.helpers import frame
from tests.router.twin.test_prior import _prior
from tests.serving.twinproc.jobs import PinnedMaker, StuckMaker

G, B = 2, 3
CFG = TwinConfig(block_requests=32, min_windows=3, cooldown=2, memory=8)
LABEL = "brh:survival{horizon=16}"


def _arm(label: str = LABEL) -> Arm:
    spec = RouterSpec.parse(label)
    if spec.estimator is None:
        return Arm(label, spec, spec.build_policy(), None)
    rng = np.random.default_rng(7)
    history = frame(rng.integers(100, 3000, 300), rng.integers(1, 40, 300))
    handle = Handle(build_estimator(spec.estimator, history=history, horizon=16))
    handle.muted = True
    return Arm(label, spec, spec.build_policy(handle), handle)


class Traffic:
    """Requests through the live group and the twins' feed, as :mod:`...decider` reports them:
    arrival, tokens, finish (or abandon), one decision per step."""

    def __init__(self, arms: list[Arm], twins: GatewayTwins, seed: int = 0) -> None:
        self.group = LiveGroup.sized(G, B, 64)
        sb = Switchback([a.label for a in arms], 1e9, 0.0, 0, 0.0)
        ticks = itertools.count()
        self.clock = lambda: next(ticks) * 0.01
        self.d = Dispatcher(self.group, arms, sb, GatewayMetrics(), clock=self.clock,
                            twins=twins)  # fmt: skip
        self.twins = twins
        self.rng = np.random.default_rng(seed)
        self.tickets: dict[int, int] = {}
        self.target: dict[int, int] = {}
        self.blends: list[float | None] = []

    def step(self) -> None:
        g, rng = self.group, self.rng
        for _ in range(int(rng.binomial(2, 0.5))):
            p = g.arrive(int(rng.integers(50, 2000)), int(rng.integers(1, 9)), self.clock())
            if p is not None:
                self.tickets[p] = self.twins.arrived(float(g.arrival_s[p]), 10, 1)
                self.target[p] = int(rng.integers(1, 30))
        for p in g.running_positions().tolist():
            g.advance(p, int(g.age[p]) + 1)
            if g.age[p] >= self.target[p]:
                self.twins.finished(self.tickets.pop(p), int(g.age[p]), self.clock())
                g.leave(p, int(g.age[p]), learn=True)
        if g.pool.size > 8:  # a waiting client walks away
            p = int(g.pool.head(1)[0])
            self.twins.dropped(self.tickets.pop(p))
            g.abandon(p)
        self.d.decide()
        active = self.d.active
        self.blends.append(getattr(active.policy, "blend", None))


def test_which_arms_a_twin_drives():
    assert twin_drives(_arm())
    assert not twin_drives(_arm("brh:none"))
    assert not twin_drives(_arm("count-jsq"))
    assert not twin_drives(_arm("brh:survival{horizon=16;twin=false}"))
    assert not twin_drives(_arm("brh:survival{horizon=16;blend=0.5}"))


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_the_driven_arm_routes_at_its_twins_weight_and_the_twin_advances():
    arms = [_arm(), _arm("brh:none{horizon=16}")]
    twins = GatewayTwins(arms, G, B, config=CFG)
    traffic = Traffic(arms, twins)
    try:

        async def scenario() -> None:
            for i in range(1500):
                traffic.step()
                if i % 5 == 4:
                    twins.worker.run_once()  # a pass of the child, its report read

        asyncio.run(scenario())
        stats = twins.stats()
        assert set(stats) == {LABEL}
        assert stats[LABEL]["twin_decisions"] >= 5
        assert twins.channel.order.dropped >= 1  # the clients that walked away
        assert traffic.blends[0] == 0.0 and all(b in (0.0, 0.5, 1.0) for b in traffic.blends)
        cf = twins.comparison()
        assert cf is not None and cf["blocks"] >= 3
        assert set(cf["imbalance_ratio_vs_reference"]) == {"brh:none{horizon=16}"}
        assert twins.channel.job(COMPARISON) is not None
    finally:
        twins.stop()


def test_the_twin_steps_in_a_child_process_and_its_weight_reaches_the_arm():
    arm = _arm()
    twins = GatewayTwins([arm], G, B, config=CFG)
    twins.channel.add(LABEL, PinnedMaker(TwinGroup(arm.spec, G, B), CFG, 1.0))  # w = 1 there
    traffic = Traffic([arm], twins)
    try:
        for _ in range(600):
            for _ in range(5):
                traffic.step()
            twins.worker.run_once()
            job = twins.channel.job(LABEL)
            if job is not None and job.stats().get("step_pids"):
                break
        pid = twins.worker.pid
        assert pid is not None and pid != os.getpid()
        assert job.weight == 1.0 and job.stats()["step_pids"] == [pid]  # replayed in the child
        traffic.step()
        assert traffic.blends[-1] == 1.0
    finally:
        twins.stop()


def test_decisions_never_wait_for_a_twin_stuck_in_a_step(tmp_path):
    arm = _arm()
    twins = GatewayTwins([arm], G, B, config=replace(CFG, cpu_share=None))
    traffic = Traffic([arm], twins, seed=1)
    marker = tmp_path / "stepping"
    twins.channel.add(LABEL, StuckMaker(TwinGroup(arm.spec, G, B), None, CFG, str(marker)))
    twins.start()
    pid = twins.worker.pid
    try:
        until(marker.exists, 60.0, "the child steps", poll_s=0.001, every=traffic.step)
        assert marker.read_text() == str(pid)  # stuck in its step, in the child
        before = len(traffic.blends)
        for _ in range(100):  # the child is inside a step: decisions go on, fed to it
            traffic.step()
            twins.worker.pump(force=True)
        assert len(traffic.blends) - before == 100
        assert not twins.feed.events  # sent (or buffered), never waiting for the child
        assert all(b == 0.0 for b in traffic.blends)
    finally:
        twins.worker.stop(timeout_s=0.5)  # asked, then terminated: no child left
    assert _gone(pid)


def test_a_dead_twins_process_leaves_the_arm_at_zero_reported_and_restarted():
    arm = _arm()
    twins = GatewayTwins([arm], G, B, config=CFG, start=1.0)
    traffic = Traffic([arm], twins)
    twins.worker.backoff_s = (0.2,)  # one restart, then off
    twins.start()
    try:
        twins.worker.run_once()
        first = twins.worker.pid
        assert twins.weight(LABEL) == 1.0 and twins.worker.status()["state"] == "running"
        states = []
        for pid in (first, None):
            pid = twins.worker.pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while twins.worker.status()["state"] == "running" and time.monotonic() < deadline:
                traffic.step()
                twins.worker.pump(force=True)
                time.sleep(0.005)
            states.append(twins.worker.status())
            assert twins.weight(LABEL) == 0.0 and twins.stats()[LABEL]["twin_weight"] == 0.0
            traffic.step()  # serving on, at w = 0
            assert traffic.blends[-1] == 0.0
            while twins.worker.pid is None and time.monotonic() < deadline and pid == first:
                traffic.step()
                twins.worker.pump(force=True)
                time.sleep(0.005)
            if pid == first:  # the restart: a new child, the twin rebuilt at its start
                twins.worker.run_once()
                assert twins.worker.pid not in (None, first)
                assert twins.weight(LABEL) == 1.0
        assert [s["state"] for s in states] == ["restarting", "off"]
        assert states[1]["exit_codes"] == [-9, -9] and states[1]["restarts"] == 1
        assert _gone(first)
        m = GatewayMetrics()
        m.twins(twins.stats(), twins.worker.cpu_s, None, twins.worker.status())
        text = generate_latest(m.registry).decode()
        assert "balanceroute_gateway_twin_process_up 0.0" in text
        assert f'balanceroute_gateway_twin_weight{{arm="{LABEL}"}} 0.0' in text
    finally:
        twins.stop()


def test_stopping_the_twins_leaves_no_child():
    twins = GatewayTwins([_arm()], G, B, config=CFG)
    twins.start()
    pid = twins.worker.pid
    assert pid is not None and not _gone(pid)
    twins.stop()
    assert _gone(pid) and twins.worker.status()["state"] == "stopped"


def test_the_switchback_and_the_twin_agree_or_not():
    def ratio(r, lo, hi):
        return {"ratio": r, "low": lo, "high": hi, "blocks": 5}

    summary = {"imbalance_ratio_vs_reference": {"a": ratio(0.9, 0.8, 1.0), "b": ratio(0.9, 0.85,
               0.95), "c": ratio(1.1, None, None) | {"low": None, "high": None}}}  # fmt: skip
    twin = {"imbalance_ratio_vs_reference": {"a": ratio(0.95, 0.9, 0.99), "b": ratio(1.05, 1.01,
            1.1), "c": ratio(1.0, 0.9, 1.1)}}  # fmt: skip
    out = twin_agreement(summary, twin)
    assert out["a"]["verdict"] == "agree"
    assert out["b"]["verdict"] == "disagree" and out["b"]["same_side"] is False
    assert out["c"]["verdict"] == "undecided"
    assert not any(row["identical"] for row in out.values())  # no weights: not twin-driven


def test_an_agreement_where_the_twin_held_zero_says_the_arms_were_identical():
    """Live, a twin that never left w = 0 makes its arm the reference: the counterfactual ratio
    is exactly 1 on every block, and the report must say the agreement judged no estimator."""
    measured = {"ratio": 0.89, "low": 0.55, "high": 1.43, "blocks": 14}
    held = {"ratio": 1.0, "low": 1.0, "high": 1.0, "blocks": 2, "weight_mean": 0.0}
    moved = held | {"ratio": 0.9, "low": 0.85, "high": 0.95, "weight_mean": 0.75}
    summary = {"arms": ["brh:none", "x", "y"], "reference": "brh:none", "window_s": 30.0,
               "warmup_s": 7.5, "windows_done": 28, "seed": 0, "per_arm": {},
               "paired_vs_reference": {},
               "imbalance_ratio_vs_reference": {"x": measured, "y": measured}}  # fmt: skip
    twin = {"block_requests": 2048, "blocks": 2,
            "imbalance_ratio_vs_reference": {"x": held, "y": moved}}  # fmt: skip
    out = twin_agreement(summary, twin)
    assert out["x"]["verdict"] == "agree" and out["x"]["identical"] is True
    assert out["x"]["twin_weight_mean"] == 0.0
    assert out["y"]["identical"] is False and out["y"]["twin_weight_mean"] == 0.75
    report = report_markdown(summary | {"twin_agreement": out, "twin_comparison": twin}, {})
    rows = [line for line in report.splitlines() if line.startswith(("| `x`", "| `y`"))]
    assert rows[0].endswith("| 0.00 | agree |") and rows[1].endswith("| 0.75 | agree |")
    assert "`x`: the twin held w = 0 on every replayed block" in report
    assert "`y`: the twin held" not in report


def test_a_model_with_a_prior_for_this_group_starts_its_twin_there_and_another_shape_at_zero():
    here, other = _arm(), _arm()
    attach_priors(local_model(here), [_prior(1.0, G, B)])
    attach_priors(local_model(other), [_prior(1.0, G + 1, B)])
    started = {}
    for name, arm in (("here", here), ("other", other)):
        twins = GatewayTwins([arm], G, B, config=CFG)
        assert twins.weight(LABEL) == started.setdefault(name, twins.weight(LABEL))
        traffic = Traffic([arm], twins)

        async def one(traffic: Traffic = traffic) -> None:
            traffic.step()

        asyncio.run(one())
        twins.worker.run_once()  # the twin is made from the prior, in the child
        job = twins.channel.job(LABEL)
        twins.stop()
        assert job is not None
        started[name] = (started[name], job.weight, traffic.blends[-1])
    assert started == {"here": (1.0, 1.0, 1.0), "other": (0.0, 0.0, 0.0)}


def test_metrics_carry_the_twins_thread_cpu_and_the_counterfactuals_blocks():
    """The per-arm CPU leaves the comparison out; the thread's gauge is what the cap bounds."""
    m = GatewayMetrics()
    row = {"twin_weight": 0.5, "twin_decisions": 3, "twin_switches": 1, "twin_cpu_s": 2.0,
           "twin_lag_blocks": 0}  # fmt: skip
    m.twins({"a": row}, 3.25, {"blocks": 2})
    text = generate_latest(m.registry).decode()
    assert "balanceroute_gateway_twin_worker_cpu_seconds 3.25" in text
    assert "balanceroute_gateway_twin_comparison_blocks 2.0" in text
    assert 'balanceroute_gateway_twin_cpu_seconds{arm="a"} 2.0' in text
    m.twins({"a": row})  # no thread figures given: the last ones stay
    assert (
        "balanceroute_gateway_twin_worker_cpu_seconds 3.25" in generate_latest(m.registry).decode()
    )


def test_twins_off_route_at_the_start_weight_and_replay_nothing():
    arms = [_arm(), _arm("brh:none{horizon=16}")]
    twins = GatewayTwins(arms, G, B, config=CFG, enabled=False)
    traffic = Traffic(arms, twins)
    for _ in range(400):
        traffic.step()
    assert twins.channel.jobs == {} and twins.comparison() is None
    assert twins.channel.order.numbered == 0 and not twins.feed.events  # nothing fed
    twins.start()
    assert twins.worker.proc is None  # no child process
    assert twins.stats()[LABEL]["twin_decisions"] == 0
    assert {b for b in traffic.blends if b is not None} == {0.0}
    assert twins.weight(LABEL) == 0.0


def test_the_gateway_flags_turn_the_twins_off_and_set_their_threads_nice(capsys):
    base = ["gateway", "--rank", "http://127.0.0.1:1", "--slots", "4"]
    args = build_parser(base).parse_args(base)
    s = settings_from_args(args)
    assert s.twins and s.twin_nice == 0
    args = build_parser(base).parse_args([*base, "--no-twins", "--twin-nice", "10"])
    s = settings_from_args(args)
    assert not s.twins and s.twin_nice == 10
    with pytest.raises(SystemExit):  # the setting's bound, checked as the flag is read
        build_parser(base).parse_args([*base, "--twin-nice", "20"])
    assert "--twin-nice: must be at most 19" in capsys.readouterr().err

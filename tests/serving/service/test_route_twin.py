"""The live twin of /v1/route: requests seen across calls (arrivals, finishes, drops), numbered
in arrival order, the twin advancing in its child process and the routing path never waiting
for it."""

from __future__ import annotations

import os
import re
import threading
import time

import numpy as np
import pytest

from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.prior import attach_priors
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.service.snapshot import decide
from balanceroute.serving.service.twin_cache import JOB, RouteTwins
from tests.poll import until
from tests.router.helpers import frame
from tests.router.twin.test_prior import _prior
from tests.serving.service.helpers import Server, post
from tests.serving.twinproc.jobs import RecordingMaker, StuckMaker

G, B = 2, 4


def _body(k: int, running: list[list[dict]], pool: list[dict], policy_options=None) -> dict:
    return {
        "policy": "brh",
        "options": {"horizon": 8, **(policy_options or {})},
        "workers": [{"free_slots": B - len(r), "running": r} for r in running],
        "pool": pool,
        "slots": B,
        "iteration": k,
        "time_s": 0.05 * k,
    }


def _estimator() -> SurvivalEstimator:
    rng = np.random.default_rng(0)
    return SurvivalEstimator(horizon=8).fit(
        frame(rng.integers(10, 900, 300), rng.integers(1, 9, 300))
    )


class Dispatcher:
    """A caller of /v1/route every iteration (in-process): running requests age by one and
    finish after their output length; the admitted ones run; some waiting ones give up."""

    def __init__(self, twins: RouteTwins | None, seed: int = 0, client=None) -> None:
        self.twins = twins
        self.client = client  # route over HTTP (a real server) instead of in-process
        self.rng = np.random.default_rng(seed)
        self.est = _estimator()
        self.lock = threading.Lock()
        self.running: list[list[dict]] = [[] for _ in range(G)]
        self.pool: list[dict] = []
        self.remaining: dict[str, int] = {}
        self.output: dict[str, int] = {}
        self.given_up: set[str] = set()
        self.finished: list[str] = []
        self.next_id = 0
        self.k = 0
        self.weights: list[float | None] = []

    def call(self) -> None:
        for w in self.running:  # finish, then age the others
            for r in w:
                if self.remaining[r["id"]] <= 1:
                    self.finished.append(r["id"])
            w[:] = [r for r in w if self.remaining[r["id"]] > 1]
            for r in w:
                self.remaining[r["id"]] -= 1
                r["age"] += 1
        if self.pool and self.rng.random() < 0.05:  # a waiting client gives up
            self.given_up.add(self.pool.pop()["id"])
        for _ in range(int(self.rng.binomial(2, 0.75))):  # below capacity on average
            rid = f"p{self.next_id}"
            self.next_id += 1
            self.output[rid] = int(self.rng.integers(1, 9))
            self.pool.append({"id": rid, "prompt_tokens": int(self.rng.integers(10, 900)),
                              "waited_s": 0.0})  # fmt: skip
        body = _body(self.k, self.running, self.pool)
        if self.client is not None:
            resp = post(self.client, "/v1/route", body)
            assert resp.status_code == 200, resp.text
            admissions, described = resp.json()["admissions"], resp.json()["policy"]
        else:
            admissions, described = self._in_process(body)
        self.weights.append(described.get("blend_used"))
        by_id = {p["id"]: p for p in self.pool}
        for a in admissions:
            p = by_id.pop(a["id"])
            self.running[a["worker"]].append(
                {"id": a["id"], "prompt_tokens": p["prompt_tokens"], "age": 0}
            )
            self.remaining[a["id"]] = self.output[a["id"]]
        self.pool = list(by_id.values())
        for p in self.pool:
            p["waited_s"] = round(p["waited_s"] + 0.05, 6)
        self.k += 1

    def _in_process(self, body: dict) -> tuple[list[dict], dict]:
        req = RouteRequest.model_validate(body)
        assert self.twins is not None

        def twin() -> float:
            return self.twins.for_call("a", "brh", req, self.est, self.lock)

        admissions, described = decide(req, self.est, twin)
        self.twins.admitted("a", "brh", [a["id"] for a in admissions], self.k)
        return admissions, described


def test_requests_are_numbered_in_arrival_order_with_their_output_lengths_and_the_twin_decides():
    twins = RouteTwins()
    d = Dispatcher(twins)
    d.call()
    stream = twins._streams[("a", "brh")]
    group = TwinGroup(RouterSpec("brh", None, {"horizon": 8}), G, B)
    stream.channel.add(JOB, RecordingMaker(group, d.est, twins.config), d.lock)  # reports its rows
    try:
        for i in range(420):
            d.call()
            if i % 3 == 2:
                twins.worker.run_once()  # a pass of the child, its report read: deterministic
        job = stream.channel.job(JOB)
        stats = job.stats()
    finally:
        twins.stop()
    assert stats["twin_decisions"] >= 2  # blocks judged from the calls alone
    assert stats["twin_lag_blocks"] <= 2
    # every numbered request is a finished one, with its true output length, in arrival order
    order = stream.channel.order
    assert order.dropped >= 1  # the clients that gave up were never numbered
    seen = dict(stats["fed"])
    truth = [d.output[f"p{n}"] for n in range(d.next_id) if f"p{n}" not in d.given_up]
    numbered = sorted(seen)
    assert numbered == list(range(numbered[0], numbered[-1] + 1))  # dense
    for i in numbered:
        assert seen[i] == truth[i]
    # the last call's ids only: the pool and the running requests
    assert len(stream.seen) == len(d.pool) + sum(len(w) for w in d.running)
    # every call routed at the twin's weight (w = 0 until it had evidence)
    assert d.weights[0] == 0.0 and all(w in (0.0, 0.5, 1.0) for w in d.weights)
    twins.drop("a")
    assert twins.stats() == []


def test_routing_never_waits_for_a_twin_stuck_in_a_step(tmp_path):
    twins = RouteTwins(TwinConfig(cpu_share=None))
    d = Dispatcher(twins, seed=1)
    twins.run()
    d.call()
    channel = twins._streams[("a", "brh")].channel
    marker = tmp_path / "stepping"
    group = TwinGroup(RouterSpec("brh", None, {"horizon": 8}), G, B)
    channel.add(JOB, StuckMaker(group, d.est, TwinConfig(), str(marker)), d.lock)
    try:
        until(marker.exists, 60.0, "the child steps, sticks", poll_s=0.001, every=d.call)
        pid = twins.worker.pid
        assert pid is not None and marker.read_text() == str(pid) and pid != os.getpid()
        calls = d.k
        for _ in range(50):  # the child is inside a step: routing goes on at the weight
            d.call()
        assert d.k == calls + 50
        assert all(w == 0.0 for w in d.weights)
    finally:
        twins.worker.stop(timeout_s=0.5)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # no child left


@pytest.mark.server
def test_a_real_service_twin_sees_completions_advances_and_is_in_metrics(module_server: Server):
    """A dispatcher calling a real ``serve`` every iteration: the twin of (a, brh) numbers
    the requests it saw finish, judges blocks in its background thread, and /metrics and
    /v1/route/twins report it."""
    with module_server.client() as c:
        d = Dispatcher(None, seed=3, client=c)
        for _ in range(600):
            d.call()
        twins: list[dict] = []
        for _ in range(600):  # the worker catches up in the background
            twins = c.get("/v1/route/twins").json()["twins"]
            row = next(t for t in twins if (t["arm"], t["policy"]) == ("a", "brh"))
            if row["twin_decisions"] >= 1:
                break
            time.sleep(0.1)
        text = c.get("/metrics").text
    assert row["twin_requests_numbered"] >= 128  # a block's worth of finished requests
    assert row["twin_requests_numbered"] <= len(d.finished)
    assert row["twin_decisions"] >= 1 and row["twin_cpu_s"] > 0
    assert row["twin_weight"] in (0.0, 0.5, 1.0)
    assert all(w in (0.0, 0.5, 1.0) for w in d.weights)
    for name in ("weight", "blocks", "switches", "cpu_seconds", "lag_blocks"):
        assert f'balanceroute_route_twin_{name}{{arm="a",policy="brh"}}' in text
    # the live quality of what the model predicted at admission (all finish within H = 80 here:
    # one class, so the Brier is NaN; the window counts them)
    window = re.search(
        r'balanceroute_live_window_requests\{model="survival",version="\w+"\} (\S+)', text
    )
    assert window is not None and float(window[1]) > 0
    assert re.search(r'balanceroute_live_brier\{model="survival",version="\w+"\} NaN', text)
    assert "balanceroute_route_guard" not in text  # retired


def test_without_the_twin_the_guard_steps_aside_and_without_both_the_estimator_is_used():
    """``twin=false`` leaves a guard that cannot learn within one call: w = 0, exactly the
    prediction-free decision; ``twin=false;guard=false`` uses the estimator as it is."""
    est = _estimator()
    rng = np.random.default_rng(5)
    running = [[{"id": f"r{g}{i}", "prompt_tokens": int(rng.integers(10, 900)),
                 "age": int(rng.integers(0, 8))} for i in range(2)] for g in range(G)]  # fmt: skip
    pool = [{"id": f"p{i}", "prompt_tokens": int(rng.integers(10, 900))} for i in range(9)]

    def run(options, estimator):
        req = RouteRequest.model_validate(_body(3, running, pool, options))
        return decide(req, estimator)

    aside, described = run({"twin": False}, est)
    assert described["blend_used"] == 0.0
    assert aside == run({"twin": False}, None)[0]  # as brh:none
    _, raw = run({"twin": False, "guard": False}, est)
    assert "blend_used" not in raw


@pytest.mark.parametrize(("shape", "expected"), [((G, B), 1.0), ((G + 1, B), 0.0)])
def test_a_model_with_a_prior_for_the_callers_group_routes_at_its_weight_from_the_first_call(
    shape: tuple[int, int], expected: float
):
    twins = RouteTwins()
    d = Dispatcher(twins)
    attach_priors(d.est, [_prior(1.0, *shape)])
    for _ in range(5):
        d.call()
        twins.worker.run_once()
    job = twins._streams[("a", "brh")].channel.job(JOB)
    twins.stop()
    assert job is not None and job.weight == expected
    assert d.weights == [expected] * 5

"""The gateway's parts alone: the live group and its recycled positions, the decision loop on
real policies, the switchback's schedule and intervals, stream handling, prompt counting and
settings."""

from __future__ import annotations

import asyncio
import itertools
import math

import numpy as np
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from balanceroute.predict.base import CompletedBatch
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.router.lab.switchback import Switchback, difference_by_block
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import Admissions
from balanceroute.serving.gateway.arms import Arm, Handle
from balanceroute.serving.gateway.decider import LiveRequest
from balanceroute.serving.gateway.dispatch import Dispatcher, tick_table
from balanceroute.serving.gateway.metrics import GatewayMetrics, P
from balanceroute.serving.gateway.plane.request import Stream, rank_body, read_event
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.lifecycle.recent import RecentCompletions

# ---- the live group -----------------------------------------------------------------------------

OPS = st.lists(
    st.tuples(
        st.sampled_from(["arrive", "admit", "token", "finish", "abandon", "requeue", "tell",
                         "health"]),
        st.integers(0, 10_000),
    ),
    max_size=200,
)


@settings(max_examples=60, deadline=None)
@given(OPS)
def test_positions_are_never_shared_and_reused_only_after_on_complete(ops) -> None:
    group = LiveGroup.sized(ranks=3, slots=2, max_pool=4)
    told: set[int] = set()  # positions handed to on_complete, not yet released
    live: set[int] = set()  # positions waiting or running
    for op, r in ops:
        if op == "arrive":
            p = group.arrive(1 + r % 50, r, 0.0)
            if p is not None:
                assert p not in live and p not in told
                live.add(p)
        elif op == "admit" and group.pool.size:
            free = group.free_slots()
            if free.sum():
                p = int(group.pool.head(1)[0])
                group.start(p, int(np.flatnonzero(free)[0]))
        elif op == "token":
            running = group.running_positions()
            if running.size:
                p = int(running[r % running.size])
                group.advance(p, int(group.age[p]) + 1)
        elif op in ("finish", "requeue"):
            running = group.running_positions()
            if running.size:
                p = int(running[r % running.size])
                if op == "finish":
                    group.leave(p, int(group.age[p]), learn=True)
                    live.discard(p)
                else:
                    new = group.requeue(p)
                    live.discard(p)
                    if new is not None:
                        assert new not in live
                        live.add(new)
        elif op == "abandon" and group.pool.size:
            p = int(group.pool.head(1 + r % group.pool.size)[-1])
            group.abandon(p)
            live.discard(p)
        elif op == "tell":
            deps = group.take_departures()
            told |= {d.position for d in deps}
            group.release(deps)
            told.clear()
        elif op == "health":
            group.set_healthy(r % 3, bool(r % 2))
        running = set(group.running_positions().tolist())
        waiting = set(group.pool.order)
        pending = {d.position for d in group.departures}
        assert running | waiting == live
        assert not running & waiting
        assert not pending & live
        assert (group.inflight == np.bincount(group.rank[group.rank >= 0], minlength=3)).all()
        assert (group.inflight <= group.slots).all()
        assert group.positions_free + len(live) + len(pending) == group.capacity
        # the counts kept beside the arrays, and what they shortcut
        assert group.running_total == int(group.inflight.sum())
        assert group.out_of_rotation == int((~group.healthy).sum())
        free = np.where(group.healthy, np.maximum(group.slots - group.inflight, 0), 0)
        assert group.free_slots().tolist() == free.tolist()
        assert group.has_free_slot() == bool(free.any())
        assert group.snapshot(0.0).admissions_due == min(group.pool.size, int(free.sum()))


def test_requeued_request_goes_to_the_head_of_the_pool() -> None:
    group = LiveGroup.sized(2, 1, 8)
    a, b = group.arrive(10, 1, 0.0), group.arrive(20, 2, 0.5)
    group.start(a, 0)
    new = group.requeue(a)
    assert group.pool.head(2).tolist() == [new, b]
    assert group.table.prompt_tokens[new] == 10 and group.arrival_s[new] == 0.0
    assert [d.learn for d in group.departures] == [False]


# ---- the decision loop --------------------------------------------------------------------------


class Spy(Policy):
    """FCFS to the first free rank; records every hook and teaches its estimator, as BR-H's
    ``on_complete`` does."""

    name = "spy"

    def __init__(self, estimator: Handle | None = None) -> None:
        self.calls: list[tuple] = []
        self.estimator = estimator

    def reset(self, ctx) -> None:
        super().reset(ctx)
        self.calls.append(("reset",))

    def route(self, state):
        free = state.free_slots.copy()
        pos, wk = [], []
        for p in state.pool.head(state.admissions_due).tolist():
            g = int(np.flatnonzero(free)[0])
            free[g] -= 1
            pos.append(p)
            wk.append(g)
        return Admissions(np.array(pos, dtype=np.int64), np.array(wk, dtype=np.int64))

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.calls.append(("complete", positions.tolist(), output_tokens.tolist()))
        if self.estimator is not None:
            table = self.ctx.requests
            self.estimator.observe(CompletedBatch(table.prompt_tokens[positions], output_tokens))


def _dispatcher(group: LiveGroup, arms: list[Arm], window: float = 1e9) -> Dispatcher:
    sb = Switchback([a.label for a in arms], window, 0.0, 0, 0.0)
    ticks = itertools.count()
    return Dispatcher(group, arms, sb, GatewayMetrics(), clock=lambda: next(ticks) * 1e-3)


@pytest.mark.parametrize("router", ["count-jsq", "token-jsq", "br0", "brh"])
def test_decisions_keep_every_rank_within_b_and_skip_unhealthy_ranks(router: str) -> None:
    async def scenario() -> None:
        spec = RouterSpec.parse(router)
        handle = Handle(NoPrediction().fit()) if spec.estimator is not None else None
        arm = Arm(router, spec, spec.build_policy(handle), handle)
        group = LiveGroup.sized(ranks=3, slots=2, max_pool=32)
        d = _dispatcher(group, [arm])
        group.set_healthy(1, False)
        futures = {}
        for i in range(10):
            p = group.arrive(100 + 10 * i, i + 1, 0.0)
            futures[p] = d.waiter(p)
        assert d.decide() == 4
        assert group.inflight.tolist() == [2, 0, 2]
        ranks = {p: f.result() for p, f in futures.items() if f.done()}
        assert sorted(ranks.values()) == [0, 0, 2, 2]
        for p in ranks:
            group.advance(p, 3)
        first = next(iter(ranks))
        group.leave(first, 3, learn=True)
        group.set_healthy(1, True)
        assert d.decide() == 3  # the freed slot and rank 1's two
        assert (group.inflight <= 2).all()

    asyncio.run(scenario())


def test_every_tick_keeps_the_gateways_per_rank_view_for_the_live_benchmark() -> None:
    """A tick's sample holds the loads and running counts the gateway sees per rank, and the
    written table reads them back as lists of G (what ``live_gateway.py`` and the live view
    test compare with the emulator's log)."""

    async def scenario() -> None:
        spec = RouterSpec.parse("count-jsq")
        group = LiveGroup.sized(ranks=3, slots=2, max_pool=8)
        d = _dispatcher(group, [Arm("count-jsq", spec, spec.build_policy(None), None)])
        for i in range(4):
            d.waiter(group.arrive(100 * (i + 1), i + 1, 0.0))
        d.decide()
        running = np.flatnonzero(group.rank >= 0)
        group.advance(int(running[0]), 7)
        d.sample()
        d.sample()
        frame = tick_table(d.ticks, group.ranks).to_pandas()
        assert len(frame) == 2 and frame["pool"].tolist() == [0, 0]
        assert list(frame["loads"].iloc[-1]) == group.loads().astype(int).tolist()
        assert sum(frame["loads"].iloc[-1]) == 100 + 200 + 300 + 400 + 7
        assert list(frame["running"].iloc[-1]) == group.inflight.tolist()
        assert tick_table([], 3).num_rows == 0

    asyncio.run(scenario())


def test_on_complete_precedes_reuse_and_unfinished_requests_are_not_learned() -> None:
    async def scenario() -> None:
        spy = Spy()
        learned: list[int] = []

        class Recorder(NoPrediction):
            learns_online = True

            def observe(self, completions: CompletedBatch) -> None:
                learned.extend(completions.output_tokens.tolist())

        handle = Handle(Recorder().fit())
        spy.estimator = handle
        spy_arm = Arm("spy", RouterSpec("count-jsq"), spy, handle)
        group = LiveGroup(ranks=1, slots=1, capacity=2)
        d = _dispatcher(group, [spy_arm])
        a = group.arrive(5, 1, 0.0)
        d.waiter(a)
        d.decide()
        b = group.arrive(6, 2, 0.0)
        assert group.arrive(7, 3, 0.0) is None  # the table is full: a is running, b waits
        group.leave(a, 9, learn=True)
        assert group.arrive(7, 3, 0.0) is None  # a's position is not free before on_complete
        d.decide()
        assert ("complete", [a], [9]) in spy.calls
        assert group.rank[b] == 0
        group.leave(b, 2, learn=False)  # e.g. its client went away
        d.decide()
        assert group.arrive(7, 3, 0.0) is not None
        assert spy.calls[0] == ("reset",)
        assert learned == [9]  # b left unfinished: told to the policy, not learned

    asyncio.run(scenario())


def test_switchback_resets_each_arm_once_per_activation_and_teaches_every_estimator() -> None:
    async def scenario() -> None:
        seen: dict[str, list[int]] = {"x": [], "y": []}

        def recorder(label: str) -> Handle:
            class R(NoPrediction):
                learns_online = True

                def observe(self, completions: CompletedBatch) -> None:
                    seen[label].extend(completions.output_tokens.tolist())

            return Handle(R().fit())

        arms = []
        for label in ("x", "y"):
            handle = recorder(label)
            arms.append(Arm(label, RouterSpec("count-jsq"), Spy(handle), handle))
        group = LiveGroup.sized(1, 4, 8)
        now = [0.0]
        sb = Switchback(["x", "y"], 1.0, 0.25, 3, 0.0)
        d = Dispatcher(group, arms, sb, GatewayMetrics(), clock=lambda: now[0])
        for t in np.arange(0.0, 6.0, 0.1):
            now[0] = float(t)
            p = group.arrive(5, 1, now[0])
            d.waiter(p)
            d.decide()
            group.leave(p, 3, learn=True)
        d.decide()
        resets = sum(c == ("reset",) for a in arms for c in a.policy.calls)
        arms_in_order = [w.arm for w in sb.windows if w.start < 6.0]
        changes = 1 + sum(a != b for a, b in itertools.pairwise(arms_in_order))
        assert resets == d.activations == changes
        assert len(seen["x"]) == len(seen["y"]) == 60  # every completion taught both arms

    asyncio.run(scenario())


# ---- the switchback ------------------------------------------------------------------------------


def test_switchback_blocks_hold_every_arm_once_in_a_seeded_random_order() -> None:
    sb = Switchback(["a", "b", "c"], 10.0, 2.5, seed=7, start=100.0)
    for t in np.arange(100.0, 400.0, 5.0):
        sb.current(float(t))
    blocks: dict[int, list[str]] = {}
    for w in sb.windows:
        blocks.setdefault(w.block, []).append(w.arm)
        assert w.measure_from == w.start + 2.5 and w.end == w.start + 10.0
    assert all(sorted(v) == ["a", "b", "c"] for v in blocks.values())
    assert len({tuple(v) for v in blocks.values()}) > 1  # not always the same order
    again = Switchback(["a", "b", "c"], 10.0, 2.5, seed=7, start=0.0)
    again.current(299.0)
    assert [w.arm for w in again.windows] == [w.arm for w in sb.windows]


def test_warmup_is_left_out_and_the_paired_interval_is_a_t_interval() -> None:
    sb = Switchback(["a", "b"], 10.0, 4.0, seed=0, start=0.0)
    for t in np.arange(0.0, 80.0, 0.5):
        w = sb.current(float(t))
        sb.sample(1000.0 if t - w.start < 4.0 else (10.0 if w.arm == "a" else 30.0 + t / 10), t)
        sb.tokens(5, float(t))
    summary = sb.summary(80.0)
    assert summary["windows_done"] == 8
    assert summary["per_arm"]["a"]["imbalance"] == pytest.approx(10.0)
    rows = summary["windows"][:8]
    d = difference_by_block(rows, "a", "b", "imbalance")
    diffs = []
    for block in range(4):
        by = {r["arm"]: r["imbalance"] for r in rows if r["block"] == block}
        diffs.append(by["b"] - by["a"])
    half = 3.182446305284263 * np.std(diffs, ddof=1) / math.sqrt(4)  # t(0.975, 3)
    assert d["pairs"] == 4 and d["mean"] == pytest.approx(np.mean(diffs))
    assert d["low"] == pytest.approx(np.mean(diffs) - half)
    assert rows[0]["throughput"] == pytest.approx(5 / 0.5)


# ---- streams, prompts, settings ----------------------------------------------------------------


def _request(stream: bool, usage: bool, continuous: bool) -> LiveRequest:
    loop = asyncio.new_event_loop()
    req = LiveRequest("r", "/v1/completions", False, {}, stream, usage, continuous, 3, "k", 0.0,
                      0.0, 0, loop.create_future())  # fmt: skip
    loop.close()
    return req


def _chunk(obj: dict) -> bytes:
    return b"data: " + orjson.dumps(obj)


def test_usage_the_client_did_not_ask_for_is_stripped_and_tokens_counted() -> None:
    tok = {"id": "c", "choices": [{"index": 0, "text": " a", "finish_reason": None}],
           "usage": {"prompt_tokens": 4, "completion_tokens": 2}}  # fmt: skip
    final = {"id": "c", "choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": 2}}
    plain = _request(True, False, False)
    st_ = Stream()
    out = read_event(plain, _chunk(tok), st_, 1.0)
    assert out is not None and b"usage" not in out and b'" a"' in out
    assert read_event(plain, _chunk(final), st_, 1.0) is None
    assert st_.tokens == 2 and st_.usage_prompt == 4 and st_.chunks == 1
    wants = _request(True, True, True)
    assert read_event(wants, _chunk(tok), Stream(), 1.0) == _chunk(tok) + b"\n\n"
    assert read_event(wants, _chunk(final), Stream(), 1.0) == _chunk(final) + b"\n\n"
    assert read_event(plain, b"data: [DONE]", st_, 2.0) == b"data: [DONE]\n\n" and st_.done


def test_the_rank_body_always_streams_with_the_final_usage_chunk() -> None:
    body = orjson.loads(rank_body({"prompt": "x", "stream_options": {"include_usage": False}}))
    assert body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}


@pytest.mark.parametrize(
    "fields, words",
    [
        ({"ranks": ["ftp://x"], "slots": 2}, "http"),
        ({"ranks": ["http://a:1", "http://a:1"], "slots": 2}, "twice"),
        ({"ranks": ["http://a:1", "http://b:1"], "slots": 2, "rank_header": "X"}, "exactly one"),
        ({"ranks": ["http://a:1"], "slots": 2, "rank_header": "X"}, "group_size"),
        ({"ranks": ["http://a:1"], "slots": 2, "switch_every_s": 4, "warmup_s": 5}, "warmup"),
        ({"ranks": ["http://a:1"], "slots": 0}, "slots"),
        ({"ranks": [], "slots": 2}, "ranks"),
    ],
)
def test_bad_settings_are_refused(fields: dict, words: str) -> None:
    with pytest.raises(ValidationError, match=words):
        GatewaySettings(**fields)


def test_handle_swaps_models_and_mutes_learning() -> None:
    class Counting(NoPrediction):
        learns_online = True
        seen = 0

        def observe(self, completions: CompletedBatch) -> None:
            type(self).seen += completions.size

    h = Handle(Counting().fit())
    batch = CompletedBatch(np.array([5]), np.array([3]))
    h.observe(batch)
    h.muted = True
    h.observe(batch)
    assert Counting.seen == 1 and h.learns_online and h.name == "none"
    h.model = NoPrediction(horizon=80).fit()
    assert not h.learns_online


def test_a_prediction_service_that_is_down_falls_back_and_is_counted() -> None:
    from balanceroute.predict.remote import RemoteEstimator

    async def scenario() -> GatewayMetrics:
        remote = RemoteEstimator("http://127.0.0.1:9", fallback=None, timeout_s=0.01)
        spec = RouterSpec.parse("brh")
        handle = Handle(remote)
        arm = Arm("brh", spec, spec.build_policy(handle), handle)
        group = LiveGroup.sized(2, 2, 8)
        d = _dispatcher(group, [arm])
        for i in range(3):
            p = group.arrive(50, i + 1, 0.0)
            d.waiter(p)
        assert d.decide() == 3  # nothing runs yet: nothing to predict
        group.advance(int(group.running_positions()[0]), 1)
        p = group.arrive(60, 9, 0.0)
        d.waiter(p)
        assert d.decide() == 1  # BR-H predicted for the running ones: the service is down
        d.sample()
        return d.metrics

    metrics = asyncio.run(scenario())
    fell = metrics.registry.get_sample_value(
        "balanceroute_gateway_prediction_fallbacks_total", {"arm": "brh"}
    )
    assert fell is not None and fell >= 1


def test_every_endpoint_but_the_probes_needs_the_token() -> None:
    from fastapi.testclient import TestClient

    from balanceroute.serving.gateway.app import create_gateway_app
    from balanceroute.serving.gateway.runtime import build_gateway

    token = "s3cret-token-of-24-chars"
    settings = GatewaySettings(
        ranks=["http://127.0.0.1:9"], slots=2, router="count-jsq", api_token=token
    )
    app = create_gateway_app(build_gateway(settings))
    with TestClient(app, base_url="http://127.0.0.1") as client:
        calls = [  # the completion routes are the front's (test_plane_live checks their 401)
            ("GET", "/v1/models", None),
            ("GET", "/metrics", None),
            ("GET", "/v1/ab", None),
            ("POST", "/admin/reload", None),
            ("POST", "/admin/ab", None),
        ]
        for method, path, body in calls:
            assert client.request(method, path, json=body).status_code == 401, path
        auth = {"authorization": f"Bearer {token}"}
        assert client.get("/metrics", headers=auth).status_code == 200
        assert client.get("/v1/ab", headers=auth).json()["arms"] == ["count-jsq"]
        assert client.post("/admin/ab", headers=auth).status_code == 409  # no --out folder
        assert client.get("/healthz").status_code == 200
        assert client.get("/readyz").status_code in (200, 503)  # no token needed


def test_the_fan_out_teaches_each_arm_every_finished_request_exactly_once() -> None:
    """BR-H (which teaches its estimator from ``on_complete``, or before its next prediction) and
    a spy that teaches its own in ``on_complete``: through the one fan-out each arm's model sees
    each finished request once, in finish order, whichever arm routes; unfinished ones never."""

    async def scenario() -> tuple[dict[str, list[int]], list[int], RecentCompletions]:
        seen: dict[str, list[int]] = {}

        def recorder(label: str) -> Handle:
            seen[label] = []

            class R(NoPrediction):
                learns_online = True

                def observe(self, completions: CompletedBatch) -> None:
                    seen[label].extend(completions.output_tokens.tolist())

            return Handle(R().fit())

        arms = []
        for label, router in (("brh", "brh"), ("spy", "count-jsq")):
            handle = recorder(label)
            spec = RouterSpec.parse(router)
            policy = spec.build_policy(handle) if label == "brh" else Spy(handle)
            arms.append(Arm(label, spec, policy, handle))
        group = LiveGroup.sized(2, 3, 16)
        now = [0.0]
        recent = RecentCompletions(1000)
        d = Dispatcher(group, arms, Switchback(["brh", "spy"], 0.5, 0.0, 1, 0.0),
                       GatewayMetrics(), clock=lambda: now[0], recent=recent)  # fmt: skip
        finished: list[int] = []
        running: list[int] = []
        for i in range(80):
            now[0] = i * 0.05
            p = group.arrive(10 + i, i + 1, now[0])
            if p is not None:
                d.waiter(p)
            d.decide()
            running += [q for q in group.running_positions().tolist()
                        if q not in running]  # fmt: skip
            if len(running) >= 3:
                q = running.pop(0)
                group.advance(q, 1)
                learn = i % 7 != 0
                group.leave(q, 100 + i, learn=learn)
                if learn:
                    finished.append(100 + i)
        d.decide()
        return seen, finished, recent

    seen, finished, recent = asyncio.run(scenario())
    assert len(finished) > 40
    assert seen["brh"] == finished and seen["spy"] == finished
    assert recent.batch().output_tokens.tolist() == finished


def test_a_decisions_bookkeeping_follows_the_forward_and_counts_each_wait() -> None:
    """The decision resolves the futures first; its step time, counts and each admitted
    request's wait (arrival to decision) are recorded once the callback that forwards them is
    over (at once outside an event loop)."""

    def samples(d: Dispatcher) -> tuple[int, float, int]:
        hist = {s.name: s.value for s in d.metrics.wait.collect()[0].samples}
        name = P + "admission_wait_seconds"
        return int(hist.get(name + "_count", 0)), hist.get(name + "_sum", 0.0), len(d.step_ns["count-jsq"])

    async def scenario() -> None:
        spec = RouterSpec.parse("count-jsq")
        group = LiveGroup.sized(ranks=2, slots=2, max_pool=8)
        d = _dispatcher(group, [Arm("count-jsq", spec, spec.build_policy(None), None)])
        arrivals = [group.arrive(100, i + 1, -0.5 * i) for i in range(3)]
        futures = [d.waiter(p) for p in arrivals]
        assert d.decide(now=2.0) == 3 and all(f.done() for f in futures)
        assert samples(d) == (0, 0.0, 0)  # not yet: the forward comes first
        await asyncio.sleep(0)
        count, total, steps = samples(d)
        assert (count, steps) == (3, 1) and total == pytest.approx(2.0 + 2.5 + 3.0)

    asyncio.run(scenario())
    group = LiveGroup.sized(ranks=1, slots=1, max_pool=2)
    spec = RouterSpec.parse("count-jsq")
    d = _dispatcher(group, [Arm("count-jsq", spec, spec.build_policy(None), None)])
    group.arrive(10, 1, 0.0)
    assert d.decide(now=1.0) == 1 and samples(d)[:2] == (1, 1.0)


def test_prefill_alignment_holds_a_freed_slot_until_the_other_rank_frees_or_the_wait_ends() -> None:
    """``brh{prefill_align=2}`` live: a slot freed on one rank waits while the other is full,
    two of the gateway's step estimates at most; both ranks free, both are filled at once."""

    async def scenario() -> None:
        spec = RouterSpec.parse("brh:none{prefill_align=2}")
        arm = Arm(spec.label, spec, spec.build_policy(None), None)
        group = LiveGroup.sized(ranks=2, slots=1, max_pool=16)
        d = _dispatcher(group, [arm])
        futures = {}
        for _ in range(6):
            p = group.arrive(100, 50, 0.0)
            futures[p] = d.waiter(p)
        assert d.decide() == 2  # every rank free: no hold
        first, second = (p for p, f in futures.items() if f.done())
        group.advance(first, 2)
        group.advance(second, 2)
        group.leave(first, 2, learn=True)
        assert d.decide() == 0  # held: the other rank is full
        group.advance(second, 3)  # one step later
        assert d.decide() == 0
        group.advance(second, 4)  # two steps: the wait is over
        assert d.decide() == 1
        third = next(p for p, f in futures.items() if f.done() and p not in (first, second))
        group.advance(third, 1)
        group.leave(second, 5, learn=True)
        group.leave(third, 1, learn=True)
        assert d.decide() == 2  # both ranks free at once: admitted together
        assert group.inflight.tolist() == [1, 1]
        # a rank out of rotation is not waited for
        on = {int(group.rank[p]): p for p, f in futures.items() if f.done() and group.rank[p] >= 0}
        for p in on.values():
            group.advance(p, 1)
        group.leave(on[1], 1, learn=True)
        group.set_healthy(1, False)
        group.leave(on[0], 1, learn=True)
        assert d.decide() == 1
        assert group.inflight.tolist() == [1, 0]

    asyncio.run(scenario())

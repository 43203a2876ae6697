"""The probe of ``ttft_legs.py``: loaded by every Python process it starts (this folder on
``PYTHONPATH``), it records raw ``time.perf_counter`` stamps (one system-wide monotonic clock) of
each request in the gateway (``balanceroute gateway``), the client's start (``balanceroute bench``)
and the emulator's clock origin, into ``$BR_LEGS_DIR/<role>-<pid>.json`` at exit. It wraps
methods of the gateway's classes from outside; the library carries no probe."""

from __future__ import annotations

import atexit
import json
import os
import sys
import time

OUT = os.environ.get("BR_LEGS_DIR")
ARGV = " ".join(getattr(sys, "orig_argv", sys.argv))
REC: dict = {}
now = time.perf_counter


def _dump(role: str) -> None:
    def write() -> None:
        with open(os.path.join(OUT, f"{role}-{os.getpid()}.json"), "w") as f:
            json.dump(REC, f)

    atexit.register(write)


def _after(fn, cur: dict, name: str):
    def wrapped(*a, **k):
        out = fn(*a, **k)
        cur[name] = now()
        return out

    return wrapped


def _before(fn, cur: dict, name: str):
    def wrapped(*a, **k):
        cur[name] = now()
        return fn(*a, **k)

    return wrapped


def _gateway() -> None:
    from balanceroute.router.policies import balance_route, baselines
    from balanceroute.serving.gateway import clock, decider, dispatch, state, upstream
    from balanceroute.serving.gateway.plane import exchange, front

    cur: dict = {}  # the stamps of the request being handled (one at a time on the loop)
    received, complete = front.Connection.data_received, front.Connection.on_message_complete

    def data_received(self, data):
        if not self.busy and not self.headers_done and self.head_bytes == 0:
            cur.clear()
            cur["in"] = now()
        received(self, data)

    def on_message_complete(self):
        cur["body"] = now()
        complete(self)

    front.Connection.data_received, front.Connection.on_message_complete = (
        data_received, on_message_complete)  # fmt: skip
    front.check_body = _after(front.check_body, cur, "checked")
    decider.Decider.admit = _after(_before(decider.Decider.admit, cur, "admit"), cur, "decided")
    for policy in (balance_route.BalanceRoutePolicy, baselines.FCFSPolicy):
        policy.route = _after(_before(policy.route, cur, "route"), cur, "routed")
    clock.ClockedGroup.arrive = _after(clock.ClockedGroup.arrive, cur, "pooled")
    dispatch.Dispatcher.decide = _before(dispatch.Dispatcher.decide, cur, "deciding")
    state.LiveGroup.snapshot = _after(state.LiveGroup.snapshot, cur, "snapshot")
    dispatch.admission_violation = _after(dispatch.admission_violation, cur, "checked_adm")
    dispatch.after_forward = _before(dispatch.after_forward, cur, "resolved")
    made = exchange.Exchange.__init__

    def init(self, ctx, pool, client, req, rid):
        made(self, ctx, pool, client, req, rid)
        REC[req.request_id] = {**cur, "exchange": now()}

    exchange.Exchange.__init__ = init
    sent = upstream.Upstream.send

    def send(self, sink, request):
        start = now()
        sent(self, sink, request)
        if isinstance(sink, exchange.Exchange) and "forward" not in REC[sink.req.request_id]:
            REC[sink.req.request_id]["forward"] = start

    upstream.Upstream.send = send
    heard = upstream.Upstream.data_received

    def up_received(self, data):
        sink = self.sink
        if isinstance(sink, exchange.Exchange) and not sink.started:
            REC[sink.req.request_id]["token_in"] = now()
        heard(self, data)

    upstream.Upstream.data_received = up_received
    stream = front.Connection.start_stream

    def start_stream(self, headers, first=b""):
        ex = self.exchange
        if ex is not None and ex.req.request_id in REC:
            REC[ex.req.request_id]["token_out"] = now()
        stream(self, headers, first)

    front.Connection.start_stream = start_stream
    _dump("gateway")


def _bench() -> None:
    from balanceroute.serving.testbed.bench import client, run

    request = client.stream_request

    async def stream_request(session, url, body, headers, record, t0, timeout_s):
        REC.setdefault("t0", t0)
        return await request(session, url, body, headers, record, t0, timeout_s)

    client.stream_request = run.stream_request = stream_request
    _dump("bench")


def _emulator() -> None:
    from balanceroute.serving.testbed.emulator import group

    made = group.DecodeGroup.__init__

    def init(self, *a, **k):
        made(self, *a, **k)
        REC["t0"] = self.t0
        with open(os.path.join(OUT, f"emulator-{os.getpid()}.json"), "w") as f:
            json.dump(REC, f)

    group.DecodeGroup.__init__ = init


if OUT:
    if " gateway --slots" in ARGV:
        _gateway()
    elif " bench --trace" in ARGV:
        _bench()
    elif "testbed.emulator" in ARGV:
        _emulator()

"""Faults in front of real ranks: each is answered within a bounded time and loses nothing."""

from __future__ import annotations

import concurrent.futures as cf
import signal
import socket
import time

import httpx
import pytest

from balanceroute.serving.testbed.harness import free_port
from tests.conformance.engine import Engine
from tests.conformance.fakes import HangingRank
from tests.conformance.shapes import error_of
from tests.conformance.wire import body, stream


def test_hanging_rank_is_rerouted(engine: Engine, start_gateway) -> None:
    """A rank whose /health answers but whose completions hang: its requests are re-routed."""
    with HangingRank() as hung:
        gw = start_gateway([hung.url, engine.ranks[0]], "--first-token-timeout", "10s",
                           ready="/readyz")  # fmt: skip
        t0 = time.monotonic()
        with cf.ThreadPoolExecutor(4) as pool:
            done = list(pool.map(lambda _: stream(gw.url, body(engine.model), timeout_s=60.0),
                                 range(4)))  # fmt: skip
        took = time.monotonic() - t0
        assert hung.posts >= 1, "the hanging rank got no request: the check proves nothing"
    assert all(s.done and s.finish_reasons == ["length"] for s in done), [s.failure for s in done]
    assert took < 60.0


def test_unauthorized_rank_leaves_rotation(engine: Engine, start_gateway) -> None:
    """A rank that answers 401 (wrong upstream key) is taken out, naming the cause; none fail."""
    if engine.dp_url is None or engine.dp_api_key is None:
        pytest.skip("needs CONFORMANCE_DP_URL with CONFORMANCE_DP_API_KEY (a server with a key)")
    gw = start_gateway([engine.dp_url, engine.ranks[0]], ready="/readyz")
    with cf.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: stream(gw.url, body(engine.model), timeout_s=60.0),
                             range(8)))  # fmt: skip
    failed = [s.status or s.failure for s in done if not (s.done and s.events)]
    assert not failed, failed
    assert "401" in gw.output(), gw.output()[-2000:]


def test_no_rank_in_rotation_is_503(engine: Engine, start_gateway) -> None:
    """No rank in rotation: 503 with Retry-After and vLLM's body within a bounded wait."""
    gw = start_gateway([f"http://127.0.0.1:{free_port()}"])
    time.sleep(1.5)  # three health intervals: the dead rank is out
    try:
        resp = httpx.post(gw.url + "/v1/completions", json=body(engine.model), timeout=15.0)
    except httpx.TimeoutException:
        raise AssertionError("no answer within 15 s") from None
    assert resp.status_code == 503, resp.text[:300]
    assert resp.headers.get("retry-after"), dict(resp.headers)
    error_of(resp)


def test_gateway_sigterm_ends_streams_cleanly(engine: Engine, start_gateway) -> None:
    """SIGTERM to the gateway: every stream ends with [DONE] (an error event if cut), no traceback."""
    gw = start_gateway(engine.ranks)
    started = cf.ThreadPoolExecutor(2)
    first = [0]

    def seen(_: dict) -> None:
        first[0] += 1

    long = body(engine.model, max_tokens=6000)
    futures = [started.submit(stream, gw.url, long, timeout_s=90.0, on_event=seen)
               for _ in range(2)]  # fmt: skip
    deadline = time.monotonic() + 30
    while first[0] < 4 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert first[0] >= 4, "the streams never started"
    gw.proc.send_signal(signal.SIGTERM)
    done = [f.result(timeout=120) for f in futures]
    started.shutdown()
    for s in done:
        assert s.done, f"stream cut without [DONE]: {s.failure}"
        assert s.finish_reasons == ["length"] or s.errors, "cut short without an error event"
    assert "Traceback" not in gw.output(), gw.output()[-3000:]


def test_slow_headers_are_cut(engine: Engine, start_gateway) -> None:
    """A client that sends its headers a byte at a time is disconnected (the header deadline,
    10 s by default) within 30 s."""
    gw = start_gateway(engine.ranks)
    request = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200
    with socket.create_connection(("127.0.0.1", gw.port), timeout=5) as conn:
        conn.settimeout(1.0)
        t0 = time.monotonic()
        for byte in request:
            if time.monotonic() - t0 > 30:
                break
            try:
                conn.sendall(bytes([byte]))
                answer = conn.recv(64)
                if answer == b"" or answer.startswith(b"HTTP/1.1 408"):
                    return  # the gateway answered 408 and closed the connection
                raise AssertionError(f"answered before the headers were complete: {answer!r}")
            except TimeoutError:
                continue
            except OSError:
                return  # reset: closed
        raise AssertionError(f"still connected after {time.monotonic() - t0:.0f} s")

"""The gateway's view of the ranks matches vLLM's own metrics, in URL mode and header mode."""

from __future__ import annotations

import concurrent.futures as cf
import time

import httpx
import pytest

from tests.conformance.engine import Engine
from tests.conformance.processes import Gateway
from tests.conformance.wire import body, held, metric, stream

RUNNING = "balanceroute_gateway_rank_running_requests"
STREAMS = 5  # held open at once; odd, so the two ranks run different counts


def _settled(gw: Gateway, engine: Engine, want: int, timeout_s: float = 120.0) -> tuple:
    """Poll until the gateway counts ``want`` running and each rank's count equals vLLM's (or
    ``timeout_s`` passes), then both sides' per-rank counts: the last poll at which the gateway
    counted ``want``, if any (what differed while the streams ran)."""
    deadline = time.monotonic() + timeout_s
    seen = None
    while True:
        try:
            text = httpx.get(gw.url + "/metrics", timeout=5).text
            ours = [metric(text, RUNNING, rank=str(g)) for g in range(len(engine.ranks))]
            theirs = [metric(httpx.get(u + "/metrics", timeout=10).text,
                             "vllm:num_requests_running") for u in engine.ranks]  # fmt: skip
        except httpx.TimeoutException:  # a busy CPU engine answers late: ask again
            if time.monotonic() > deadline:
                raise
            continue
        if sum(ours) == want:
            seen = (ours, theirs)
            if ours == theirs:
                return seen
        if time.monotonic() > deadline:
            return seen or (ours, theirs)
        time.sleep(0.2)


def test_running_counts_follow_vllm(engine: Engine, gateway: Gateway) -> None:
    """While 5 long streams run, the gateway's per-rank running counts equal vLLM's (the streams
    are held open until the counts are compared, however slow the machine; an odd count splits
    unevenly over two ranks, so counts put on the wrong rank differ from vLLM's too)."""
    long = body(engine.model, max_tokens=8000)
    with held(gateway.url, long, STREAMS) as streams:
        ours, theirs = _settled(gateway, engine, STREAMS)
        running = sum(not f.done() for f in streams)
    assert sum(ours) == STREAMS and ours == theirs, (ours, theirs)
    assert running == STREAMS, f"only {running} streams still ran when the counts were compared"
    assert all(f.result().stopped and f.result().events for f in streams), [
        f.result().failure for f in streams
    ]


def test_header_mode_on_a_data_parallel_server(engine: Engine, start_gateway) -> None:
    """Header mode in front of one --data-parallel-size server: both engines serve requests."""
    if engine.dp_url is None:
        pytest.skip("needs CONFORMANCE_DP_URL (a --data-parallel-size server)")
    env = {"BALANCEROUTE_UPSTREAM_API_KEY": engine.dp_api_key or ""}
    gw = start_gateway([engine.dp_url], "--rank-header", "X-data-parallel-rank", "--ranks",
                       str(engine.dp_size), env=env)  # fmt: skip

    def served() -> list[float]:
        text = httpx.get(engine.dp_url + "/metrics", headers=engine.dp_headers, timeout=5).text
        return [metric(text, "vllm:request_success_total", engine=str(g))
                for g in range(engine.dp_size)]  # fmt: skip

    before = served()
    with cf.ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda _: stream(gw.url, body(engine.model, max_tokens=200)),
                             range(4)))  # fmt: skip
    assert all(s.done and s.usage is None and s.finish_reasons == ["length"] for s in done), [
        s.failure for s in done
    ]
    after = served()
    assert all(a > b for a, b in zip(after, before, strict=True)), (before, after)

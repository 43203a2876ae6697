"""Issue 18, live: faults that lose nothing. Real processes on 127.0.0.1 (emulator ranks, each a
process of its own so it can be stopped, killed and restarted; the gateway; ``bench``).

- Every rank out of rotation while requests are queued: each gets 503 with ``Retry-After`` and
  vLLM's body once the outage has lasted ``--no-rank-wait``, none hangs; a rank back within the
  wait serves them instead.
- A run where ranks are stopped (SIGTERM: the engine aborts its streams), killed (SIGKILL) and
  restarted: the completion log holds no truncated or errored request, and ``bench``'s completed
  count equals the requests that got their tokens, each logged once.
"""

from __future__ import annotations

import concurrent.futures as cf
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pandas as pd
import pytest

from tests.poll import until
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server
NO_RANK_WAIT_S = 2.0
ASKED = 300  # tokens each request of the fault run asks for (~2.6 s at --time-scale 5)
FAULT_REQUESTS = 48


def _post(url: str, stream: bool, max_tokens: int) -> tuple[httpx.Response, float]:
    """One completion (the body read whole) and when its answer ended (monotonic)."""
    body = {"prompt": "queued", "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    resp = httpx.post(url + "/v1/completions", json=body, timeout=60.0)
    return resp, time.monotonic()


def _queue_behind_one_slot(gw: GatewayProcess, queued: int) -> tuple[cf.ThreadPoolExecutor,
                                                                      cf.Future, list[cf.Future]]:  # fmt: skip
    """A long stream taking the one slot, then ``queued`` requests waiting in the pool."""
    pool = cf.ThreadPoolExecutor(queued + 1)
    long = pool.submit(_post, gw.url, True, 50_000)
    until(lambda: gw.metric("balanceroute_gateway_rank_running_requests") == 1, what="a slot")
    waiting = [pool.submit(_post, gw.url, i % 2 == 0, 20) for i in range(queued)]
    until(lambda: gw.metric("balanceroute_gateway_pool_size") == queued, what="the pool")
    return pool, long, waiting


@pytest.fixture
def one_rank(tmp_path: Path) -> Iterator[list[Emulator]]:
    """One emulator rank (a list: a test may restart it on its port)."""
    emus = [Emulator(tmp_path / "emu.out", ranks=1, slots=1, time_scale=5.0)]
    try:
        yield emus
    finally:
        for e in emus:
            e.kill()


def test_queued_requests_get_503_after_the_no_rank_wait(one_rank: list[Emulator],
                                                        tmp_path: Path) -> None:  # fmt: skip
    """Every rank drops out with requests queued: each gets 503, Retry-After and vLLM's body
    naming --no-rank-wait, once the outage has lasted it; the stream in flight ends with an
    error event and [DONE]; nothing is left in the pool."""
    [emu] = one_rank
    gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", "1", "--router", "count-jsq",
                        "--health-interval", "200ms", "--no-rank-wait", f"{NO_RANK_WAIT_S}s")  # fmt: skip
    try:
        pool, long, waiting = _queue_behind_one_slot(gw, 3)
        killed = time.monotonic()  # the outage begins after this
        emu.kill()
        answers = [f.result(timeout=120) for f in waiting]
        cut, _ = long.result(timeout=120)
        pool.shutdown()
        for resp, ended in answers:
            assert resp.status_code == 503, resp.text[:300]
            assert int(resp.headers["retry-after"]) >= 1, dict(resp.headers)
            error = orjson.loads(resp.content)["error"]
            assert {"message", "type", "param", "code"} <= set(error) and error["code"] == 503
            assert "--no-rank-wait" in error["message"] and "rank 0" in error["message"], error
            assert ended - killed >= NO_RANK_WAIT_S, "answered before the outage lasted the wait"
        assert cut.text.rstrip().endswith("data: [DONE]") and '"error"' in cut.text
        assert gw.metric("balanceroute_gateway_requests_total", outcome="no_rank") == 3
        assert gw.metric("balanceroute_gateway_pool_size") == 0
        assert "no rank is in rotation" in gw.log()
    finally:
        gw.stop()


def test_a_rank_back_within_the_wait_serves_the_queued_requests(one_rank: list[Emulator],
                                                                tmp_path: Path) -> None:  # fmt: skip
    """The rank is killed and restarted on its port within --no-rank-wait: the queued requests
    are served whole, none gets 503."""
    [emu] = one_rank
    gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", "1", "--router", "count-jsq",
                        "--health-interval", "200ms", "--no-rank-wait", "60s")  # fmt: skip
    try:
        pool, long, waiting = _queue_behind_one_slot(gw, 3)
        emu.kill()
        until(lambda: gw.metric("balanceroute_gateway_rank_healthy", rank="0") == 0,
               what="the killed rank out of rotation")  # fmt: skip
        one_rank.append(Emulator(tmp_path / "emu2.out", ranks=1, slots=1, time_scale=5.0,
                                 port_base=emu.config.port_base))  # fmt: skip
        answers = [f.result(timeout=120) for f in waiting]
        long.result(timeout=120)
        pool.shutdown()
        for resp, _ in answers:
            assert resp.status_code == 200, resp.text[:300]
            if resp.text.startswith("data:"):
                assert resp.text.rstrip().endswith("data: [DONE]") and '"error"' not in resp.text
            else:
                assert resp.json()["usage"]["completion_tokens"] == 20
        assert gw.metric("balanceroute_gateway_requests_total", outcome="no_rank") == 0
    finally:
        gw.stop()


# ---- a run with ranks stopped, killed and restarted ---------------------------------------------


def _write_trace(path: Path, requests: int, output_tokens: int, gap_s: float = 0.1) -> Path:
    """An Azure-format trace: ``requests`` requests ``gap_s`` apart, 16 prompt tokens each."""
    rows = [f"2023-11-16 18:15:{10 + i * gap_s:010.7f},16,{output_tokens}" for i in range(requests)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path


def _generated(emu: Emulator) -> float:
    return emu.metrics("vllm:generation_tokens_total")


def _streaming(emu: Emulator, since: float, tokens: int = 100) -> Callable[[], bool]:
    """The rank runs a request and has generated ``tokens`` more than ``since``: its streams are
    past their first token, so stopping it now cuts them."""
    return lambda: (emu.metrics("vllm:num_requests_running") >= 1
                    and _generated(emu) >= since + tokens)  # fmt: skip


@pytest.fixture
def fault_run(tmp_path: Path) -> dict[str, Any]:
    """bench (48 requests of 300 tokens) through the gateway over three emulator ranks while
    rank 0 is stopped (SIGTERM: it aborts its streams), rank 1 killed (SIGKILL), and both are
    restarted on their ports and come back into rotation."""
    emus = [Emulator(tmp_path / f"emu{g}.out", ranks=1, slots=4, time_scale=5.0)
            for g in range(3)]  # fmt: skip
    started: list[Emulator] = list(emus)
    gw = None
    try:
        gw = GatewayProcess(tmp_path / "gw.out", [e.urls[0] for e in emus], "--slots", "4",
                            "--router", "count-jsq", "--health-interval", "200ms",
                            "--out", str(tmp_path / "gw"))  # fmt: skip
        trace = _write_trace(tmp_path / "trace.csv", FAULT_REQUESTS, ASKED)
        argv = [sys.executable, "-m", "balanceroute.cli", "bench", "--url", gw.url, "--trace",
                str(trace), "--prompt-format", "ids", "--request-timeout", "120",
                "--out", str(tmp_path / "bench")]  # fmt: skip
        bench = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            for g, sig in ((0, signal.SIGTERM), (1, signal.SIGKILL)):
                until(_streaming(emus[g], _generated(emus[g])), what=f"rank {g} streaming")
                emus[g].proc.send_signal(sig)
                emus[g].process.terminate(20.0)  # reaped (SIGKILL'd if SIGTERM took too long)
                until(lambda g=g: gw.metric("balanceroute_gateway_rank_healthy", rank=str(g))
                       == 0, what=f"rank {g} out of rotation")  # fmt: skip
            for g in (0, 1):
                started.append(Emulator(tmp_path / f"emu{g}-again.out", ranks=1, slots=4,
                                        time_scale=5.0, port_base=emus[g].config.port_base))  # fmt: skip
            until(lambda: all(gw.metric("balanceroute_gateway_rank_healthy", rank=str(g)) == 1
                               for g in (0, 1)), what="ranks 0 and 1 back in rotation")  # fmt: skip
            output, _ = bench.communicate(timeout=300)
        finally:
            if bench.poll() is None:
                bench.kill()
                bench.wait()
        assert bench.returncode == 0, output[-2000:]
        metrics = {o: gw.metric("balanceroute_gateway_requests_total", outcome=o)
                   for o in ("completed", "aborted", "broken")}  # fmt: skip
    finally:
        if gw is not None:
            gw.stop()
        for e in started:
            e.kill()
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("**/*.parquet"))
    summary = orjson.loads((tmp_path / "bench" / "summary.json").read_bytes())
    requests = pd.read_parquet(tmp_path / "bench" / "requests.parquet")
    return {"log": log, "summary": summary, "requests": requests, "metrics": metrics}


def test_stopped_killed_and_restarted_ranks_leave_a_clean_log(fault_run: dict[str, Any]) -> None:
    """Zero truncated or errored requests in the completion log; bench's completed count equals
    the requests that got their tokens, and each of them is logged once."""
    log, summary, requests = fault_run["log"], fault_run["summary"], fault_run["requests"]
    whole = int((requests["output_tokens"] == requests["max_tokens"]).sum())
    cut = int((requests["output_tokens"] < requests["max_tokens"]).sum())
    assert cut >= 1, "no stream was cut: the faults proved nothing"
    assert fault_run["metrics"]["aborted"] >= 1 and fault_run["metrics"]["broken"] >= 1, (
        fault_run["metrics"]
    )
    assert (log["output_tokens"] == ASKED).all(), log["output_tokens"].value_counts()
    assert set(log["finish_reason"]) <= {"length", "stop"}, log["finish_reason"].value_counts()
    assert summary["completed"] == whole and summary["output_mismatch"] == 0, summary
    assert summary["completed"] + summary["failed"] == FAULT_REQUESTS
    assert len(log) == whole == fault_run["metrics"]["completed"]
    assert not any("timeout" in str(e).lower() for e in requests["error"].dropna()), (
        requests["error"].value_counts()
    )

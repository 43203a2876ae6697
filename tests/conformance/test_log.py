"""The completion log (--out) holds only requests that got what they asked for."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from tests.conformance.engine import Engine
from tests.conformance.processes import Gateway, run_bench, write_trace
from tests.conformance.wire import body, metric, stream

ASKED = 4000  # tokens each request of the rank-stop run asks for
REQUESTS = 4
TIMEOUT_S = 300.0  # bench's request timeout in that run
STREAMED = 100  # tokens rank 1 has generated in that run before it is stopped


def read_log(out: Path) -> pd.DataFrame:
    """Every row of the gateway's completion log under ``out``."""
    parts = sorted((out / "completions").glob("**/*.parquet"))
    assert parts, f"no completion log under {out}"
    return pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)


def test_log_records_finish_reason(engine: Engine, start_gateway, tmp_path: Path) -> None:
    """Each logged request carries the finish_reason the rank sent."""
    gw = start_gateway(engine.ranks, "--out", str(tmp_path / "gw"))
    with cf.ThreadPoolExecutor(2) as pool:
        done = list(pool.map(lambda _: stream(gw.url, body(engine.model)), range(2)))
    assert all(s.finish_reasons == ["length"] for s in done)
    gw.stop()
    log = read_log(tmp_path / "gw")
    assert len(log) == 2
    assert "finish_reason" in log.columns, list(log.columns)
    assert list(log["finish_reason"]) == ["length", "length"]


def _generated(url: str) -> float:
    """The tokens a vLLM rank has generated so far (its own counter)."""
    return metric(httpx.get(url + "/metrics", timeout=5).text, "vllm:generation_tokens_total")


def _wait_streaming(url: str, since: float, tokens: int = STREAMED, timeout_s: float = 180.0
                    ) -> None:  # fmt: skip
    """Wait until the rank at ``url`` runs a request and has generated ``tokens`` more than
    ``since``: its streams are past their first token, so stopping it now cuts them."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            text = httpx.get(url + "/metrics", timeout=10).text
        except httpx.TimeoutException:  # a busy CPU engine answers late: ask again
            continue
        running = metric(text, "vllm:num_requests_running")
        if running >= 1 and metric(text, "vllm:generation_tokens_total") >= since + tokens:
            return
        time.sleep(0.2)
    raise AssertionError(f"the rank at {url} never streamed {tokens} tokens")


@pytest.fixture(scope="module")
def rank_stopped_run(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """bench through the gateway (with --out) while rank 1 is stopped with SIGTERM mid-stream."""
    if engine.stop_pid is None or len(engine.ranks) < 2:
        pytest.skip("needs CONFORMANCE_STOP_PID: the pid of rank 1, which this run stops")
    tmp = tmp_path_factory.mktemp("rank-stop")
    trace = str(write_trace(tmp / "trace.csv", REQUESTS, ASKED))
    gw = Gateway(tmp, engine.ranks, "--out", str(tmp / "gw"))
    args = ("--trace", trace, "--prompt-format", "ids", "--request-timeout", str(TIMEOUT_S))
    since = _generated(engine.ranks[1])
    try:
        with cf.ThreadPoolExecutor(1) as pool:
            via = pool.submit(run_bench, tmp / "via", gw.url, engine.model, *args,
                              timeout_s=TIMEOUT_S + 120)  # fmt: skip
            _wait_streaming(engine.ranks[1], since)
            os.kill(engine.stop_pid, signal.SIGTERM)
            via.result(timeout=TIMEOUT_S + 180)
    finally:
        gw.stop()
    return {"log": read_log(tmp / "gw"), "via": _bench(tmp / "via")}


def _bench(folder: Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """A bench run's summary and per-request rows."""
    summary = json.loads((folder / "bench" / "summary.json").read_text())
    return summary, pd.read_parquet(folder / "bench" / "requests.parquet")


def _cut(requests: pd.DataFrame) -> int:
    """How many requests got fewer tokens than they asked for."""
    return int((requests["output_tokens"] < requests["max_tokens"]).sum())


@pytest.mark.stops_rank
def test_log_has_no_truncated_rows_after_rank_stop(rank_stopped_run: dict[str, Any]) -> None:
    """After a rank's SIGTERM the log holds only whole requests, each with its finish_reason."""
    requests = rank_stopped_run["via"][1]
    assert _cut(requests) >= 1, "no stream was cut: the run proves nothing"
    log = rank_stopped_run["log"]
    short = log[log["output_tokens"] != ASKED]
    assert short.empty, short[["request_id", "output_tokens"]].to_dict("records")
    assert "finish_reason" in log.columns, list(log.columns)
    assert set(log["finish_reason"]) <= {"length", "stop"}, log["finish_reason"].value_counts()

"""``bench`` on its own: request plans, failures kept with their errors, bounded runs."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pandas as pd
import pytest

from balanceroute.features.errors import UserError
from balanceroute.features.prompts import build_prompt, prompt_key_of
from balanceroute.features.synthetic import generate
from balanceroute.features.workload import WorkloadSpec
from balanceroute.serving.testbed.bench.plan import make_plan, resolve_targets
from balanceroute.serving.testbed.bench.run import BenchConfig, run_bench
from balanceroute.serving.testbed.harness import free_port

VLLM_KEYS = [
    "duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
    "request_throughput", "output_throughput", "total_token_throughput",
    *[f"{s}_{m}_ms" for m in ("ttft", "tpot", "itl", "e2el")
      for s in ("mean", "median", "std", "p95", "p99")],
]  # fmt: skip


def test_targets_and_round_robin_plan():
    t = resolve_targets(
        ["http://h:1", "http://h:2/v1", "http://h:3/v1/chat/completions"], "completions"
    )
    assert [x.url for x in t] == [
        "http://h:1/v1/completions",
        "http://h:2/v1/completions",
        "http://h:3/v1/chat/completions",
    ]
    with pytest.raises(UserError):
        resolve_targets(["h:1"], "completions")
    frame = generate("azure-conv", 9, seed=1)
    plan = make_plan(frame, t[:2], rate_scale=2.0, model="m")
    assert plan.target.tolist() == [0, 1] * 4 + [0]
    assert plan.send_s[0] == 0 and plan.send_s[-1] == pytest.approx(
        (frame["arrival_s"].iloc[-1] - frame["arrival_s"].iloc[0]) / 2
    )
    body = orjson.loads(plan.body(3))
    assert body["max_tokens"] == frame["output_tokens"].iloc[3]
    assert body["ignore_eos"] is True and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert body["prompt"] == build_prompt(
        int(frame["prompt_tokens"].iloc[3]), frame["prompt_key"].iloc[3]
    )
    # the trace key survives: rows of one key share the live key
    keys = {}
    for i in range(plan.size):
        live = prompt_key_of(orjson.loads(plan.body(i))["prompt"])
        keys.setdefault(frame["prompt_key"].iloc[i], set()).add(live)
    assert all(len(v) == 1 for v in keys.values())


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A TCP server that accepts connections and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    stop.set()
    thread.join()
    for c in held:
        c.close()
    sock.close()


def _config(tmp_path: Path, urls: list[str], requests: int, **kw) -> BenchConfig:
    return BenchConfig(
        urls=tuple(urls),
        out_dir=str(tmp_path / "out"),
        workload=WorkloadSpec(preset="azure-conv", requests=requests),
        model="m",
        progress=False,
        **kw,
    )


def test_dead_endpoint_fails_fast_and_keeps_every_error(tmp_path: Path):
    port = free_port()
    t0 = time.monotonic()
    res = run_bench(_config(tmp_path, [f"http://127.0.0.1:{port}"], requests=5, rate_scale=100.0))
    assert time.monotonic() - t0 < 20
    s = res.summary
    assert s["completed"] == 0 and s["failed"] == 5
    assert all(k in s for k in VLLM_KEYS)
    table = pd.read_parquet(tmp_path / "out" / "requests.parquet")
    assert len(table) == 5 and (table["error"].str.len() > 0).all() and not table["success"].any()
    assert orjson.loads((tmp_path / "out" / "summary.json").read_bytes())["failed"] == 5


def test_silent_endpoint_times_out_and_the_run_is_bounded(tmp_path: Path, silent_server: str):
    t0 = time.monotonic()
    res = run_bench(
        _config(
            tmp_path, [silent_server], requests=4, rate_scale=0.05, request_timeout_s=0.5,
            max_duration_s=2.0,
        )
    )  # fmt: skip
    assert time.monotonic() - t0 < 15
    errors = res.requests["error"].tolist()
    assert res.summary["failed"] == 4
    assert "timed out after 0.5 s" in errors[0]
    assert any(e.startswith("not sent") or e.startswith("cancelled") for e in errors[1:])


def test_load_follows_the_emulator_time_scale(tmp_path: Path):
    url = f"http://127.0.0.1:{free_port()}"
    scales = []
    for time_scale in (1.0, 4.0):
        cfg = _config(
            tmp_path / str(time_scale), [url], requests=20, load=0.01, slots=8,
            time_scale=time_scale, max_duration_s=1.0,
        )  # fmt: skip
        scales.append(run_bench(cfg).summary["rate_scale"])
    assert scales[1] == pytest.approx(4 * scales[0])
    with pytest.raises(UserError):
        _config(tmp_path, [url], 5, rate_scale=2.0, load=1.0)

"""The live test bed end to end: a real emulator process, ``balanceroute bench`` against it, and
the simulator replaying the emulator's admissions from its log."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from balanceroute.cli import main as balanceroute_main
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log
from balanceroute.serving.testbed.emulator.parity import compare
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server

RANKS, SLOTS = 3, 4


def _walk_away(url: str) -> None:
    """Open a long stream, read a few tokens, disconnect."""
    body = {"prompt": "gone soon", "max_tokens": 10_000, "ignore_eos": True, "stream": True}
    with (
        httpx.Client(timeout=30.0) as client,
        client.stream(
            "POST", url + "/v1/completions", json=body, headers={"x-request-id": "walker"}
        ) as r,
    ):
        for n, _ in enumerate(r.iter_lines()):
            if n >= 8:
                return


@pytest.fixture(scope="module")
def live_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """60 azure-conv requests replayed by ``bench`` against G = 3, B = 4 at 20x real time,
    fast enough that rank queues form; the emulator's counters are read before it stops."""
    base = tmp_path_factory.mktemp("live")
    log_dir = base / "emulator-log"
    emu = Emulator(
        base / "emulator.out",
        ranks=RANKS,
        slots=SLOTS,
        time_scale=20.0,
        log_dir=str(log_dir),
    )
    try:
        # a client that walks away mid-stream: the parity must hold with a cancelled request too
        walker = threading.Thread(target=_walk_away, args=(emu.urls[0],))
        walker.start()
        args = ["bench", "--preset", "azure-conv", "--requests", "60", "--rate-scale", "30"]
        args += ["--out", str(base / "bench"), "--request-timeout", "60", "--no-progress"]
        for url in emu.urls:
            args += ["--url", url]
        assert balanceroute_main(args) == 0
        walker.join()
        counters = {
            name: emu.metrics(name)
            for name in (
                "vllm:generation_tokens_total",
                "vllm:prompt_tokens_total",
            )
        }
        for reason in ("length", "stop", "abort"):
            counters[reason] = emu.metrics("vllm:request_success_total", finished_reason=reason)
        counters["accepted"] = emu.state()["accepted"]
    finally:
        emu.stop()
    summary = pd.read_json(base / "bench" / "summary.json", typ="series")
    requests = pd.read_parquet(base / "bench" / "requests.parquet")
    iterations, emu_requests = read_log(log_dir)
    yield {
        "counters": counters,
        "summary": summary,
        "requests": requests,
        "log_dir": log_dir,
        "iterations": iterations,
        "emu_requests": emu_requests,
    }


def test_bench_counts_equal_the_emulator_counters(live_run):
    s, c = live_run["summary"], live_run["counters"]
    walker = live_run["emu_requests"].set_index("request_id").loc["walker"]
    assert walker["finish_reason"] == "abort" and 0 < walker["generated"] < 10_000
    assert s["completed"] == 60 and s["failed"] == 0
    assert s["completed"] == c["length"] == c["accepted"] - 1 and c["stop"] == 0
    assert c["abort"] == 1
    assert s["total_output_tokens"] == c["vllm:generation_tokens_total"] - walker["generated"]
    assert s["total_input_tokens"] == c["vllm:prompt_tokens_total"] - walker["prompt_tokens"]
    req = live_run["requests"]
    # every streamed request received exactly max_tokens token events (and [DONE]: success)
    assert (req["token_events"] == req["max_tokens"]).all()
    assert (req["output_tokens"] == req["max_tokens"]).all()
    assert req["success"].all()
    for key in ("request_throughput", "output_throughput", "median_ttft_ms", "p99_itl_ms"):
        assert s[key] > 0


def test_simulator_reproduces_the_emulator_exactly(live_run):
    report = compare(live_run["log_dir"])
    assert report["requests"] == 61  # with the request whose client walked away
    assert report["sim_iterations"] == report["iterations"] > 0
    assert report["loads_equal"], report
    assert report["model_start_equal"], report
    assert report["duration_max_abs_diff_s"] == 0.0
    assert report["tokens_equal"] and report["running_equal"]
    walker = live_run["emu_requests"].set_index("request_id").loc["walker", "generated"]
    assert report["total_tokens"] == live_run["summary"]["total_output_tokens"] + walker


def test_ranks_hold_at_most_b_and_queues_drain_fcfs(live_run):
    it, rq = live_run["iterations"], live_run["emu_requests"]
    running = rank_matrix(it, "running")
    waiting = rank_matrix(it, "waiting")
    assert running.max() == SLOTS
    assert waiting.max() > 0, "the test should make queues form"
    assert (waiting[running < SLOTS] == 0).all()  # nobody waits while a slot is free
    for _, rank in rq.groupby("worker"):
        admit = rank.sort_values("seq")["admit_iteration"].to_numpy()
        assert (np.diff(admit) >= 0).all(), "a rank admitted out of arrival order"
    # request ids sent by bench are the ones the emulator logged
    assert set(rq["request_id"]) == {*live_run["requests"]["request_id"], "walker"}


def test_logs_are_complete_parquet(live_run):
    it = live_run["iterations"]
    assert (np.diff(it["iteration"].to_numpy()) == 1).all()
    assert (it["end_s"] >= it["start_s"]).all()
    assert not any(Path(live_run["log_dir"]).rglob(".*.tmp"))

"""The gateway end to end, with real processes on 127.0.0.1: emulator ranks, the gateway, the
benchmark client and an MLflow store.

One scenario runs against a group of 3 ranks x 4 slots at 20x real time: ``bench`` through the
gateway while the model is reloaded and non-streaming clients are served (phase A); then the pool
is filled until the gateway answers 429, and every client walks away (phase B); then a
switchback gateway alternates two arms. The tests assert on what each phase recorded. Faults of
a rank and the header mode have scenarios of their own.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
import pytest

from balanceroute.cli import main as balanceroute_main
from balanceroute.features.loaders import load_trace
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import save_estimator
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log
from tests.serving.gateway.helpers import GatewayProcess, completion, token_events
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server

RANKS, SLOTS = 3, 4
POOL = 64  # phase A never holds more than 63 requests at once (60 bench + 3 whole)
STOPPED = (0, -signal.SIGTERM)  # uvicorn re-raises the signal once it has shut down


def _alive(pid: int, wait_s: float = 5.0) -> bool:
    """Whether process ``pid`` still runs after up to ``wait_s`` (a stopping child's exit)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.05)


def _model(folder: Path) -> Path:
    history = generate("azure-conv", 300, seed=1)
    est = build_estimator(EstimatorSpec("survival"), history=history, horizon=80)
    return save_estimator(est, folder / "survival.joblib")


async def _hold_streams(url: str, n: int, max_tokens: int, opened: list, stop: asyncio.Event):
    """Open ``n`` long streams and keep them until ``stop``; then walk away (disconnect)."""
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def one(i: int) -> None:
            body = {"prompt": f"long {i}", "max_tokens": max_tokens, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                opened.append(r.status_code)
                await stop.wait()

        tasks = [asyncio.create_task(one(i)) for i in range(n)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


BAD_BODIES: list[tuple[str, Any, dict[str, str], int]] = [
    ("/v1/completions", b"{not json", {"content-type": "application/json"}, 400),
    ("/v1/completions", b"[1, 2]", {"content-type": "application/json"}, 400),
    ("/v1/completions", {"max_tokens": 3}, {}, 400),
    ("/v1/completions", {"prompt": "a", "n": 2}, {}, 400),
    ("/v1/completions", {"prompt": ["a", "b"]}, {}, 400),
    ("/v1/completions", {"prompt": "a", "stream": "yes"}, {}, 400),
    ("/v1/completions", {"prompt": "a", "max_tokens": 0}, {}, 400),
    ("/v1/completions", {"prompt": ""}, {}, 400),
    ("/v1/chat/completions", {"messages": []}, {}, 400),
    ("/v1/chat/completions", {"messages": [{"content": "x"}]}, {}, 400),
    ("/v1/completions", b'{"prompt": "a"}', {"content-type": "text/plain"}, 400),
    ("/v1/completions", {"prompt": "a"}, {"host": "evil.example"}, 400),
    ("/v1/completions", {"prompt": "a", "max_tokens": 10**9}, {}, 400),  # the rank's 400
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base = tmp_path_factory.mktemp("gateway")
    model = _model(base)
    emu = Emulator(base / "emu.out", ranks=RANKS, slots=SLOTS, time_scale=20.0,
                   log_dir=str(base / "emu-log"))  # fmt: skip
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{base / 'mlflow.db'}"}
    out: dict[str, Any] = {"base": base, "model": model}
    gw = None
    try:
        gw = GatewayProcess(base / "gw.out", emu.urls, "--slots", str(SLOTS), "--router", "brh",
                            "--estimator", f"survival@{model}", "--out", str(base / "gw"),
                            "--max-pool", str(POOL), env=env)  # fmt: skip
        # phase A: bench, reloads and non-streaming clients at once
        reloads: list[dict] = []
        whole: list[httpx.Response] = []
        peak = [0.0]

        def reload_loop() -> None:
            for _ in range(4):
                time.sleep(0.3)
                reloads.append(gw.post("/admin/reload").json())

        def whole_clients() -> None:
            for n in (3, 17, 40):
                whole.append(completion(gw.url, n, stream=False, rid=f"whole-{n}"))

        def watch() -> None:
            while not done.is_set():
                for g in range(RANKS):
                    peak[0] = max(peak[0], gw.metric(
                        "balanceroute_gateway_rank_running_requests", rank=str(g)))  # fmt: skip
                time.sleep(0.05)

        done = threading.Event()
        threads = [threading.Thread(target=f) for f in (reload_loop, whole_clients, watch)]
        for t in threads:
            t.start()
        args = ["bench", "--url", gw.url, "--preset", "azure-conv", "--requests", "60",
                "--rate-scale", "30", "--out", str(base / "bench"), "--request-timeout", "60",
                "--no-progress"]  # fmt: skip
        assert balanceroute_main(args) == 0
        threads[0].join()
        threads[1].join()
        done.set()
        threads[2].join()
        out.update(reloads=reloads, whole=whole, peak=peak[0])
        out["phase_a_end"] = emu.state()["iteration"]
        out["after_a"] = {
            "running": sum(
                gw.metric("balanceroute_gateway_rank_running_requests", rank=str(g))
                for g in range(RANKS)
            ),
            "completed": gw.metric("balanceroute_gateway_requests_total", outcome="completed"),
        }
        # phase B: fill every slot and the pool, get a 429, then every client walks away
        opened: list[int] = []

        async def phase_b() -> None:
            stop = asyncio.Event()
            holder = asyncio.create_task(
                _hold_streams(gw.url, RANKS * SLOTS + POOL, 5000, opened, stop)
            )
            deadline = time.monotonic() + 30
            while gw.metric("balanceroute_gateway_pool_size") < POOL:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.05)
            async with httpx.AsyncClient(timeout=10) as client:
                body = {"prompt": "one too many", "max_tokens": 2}
                out["full"] = await client.post(gw.url + "/v1/completions", json=body)
            out["pool_when_full"] = gw.metric("balanceroute_gateway_pool_size")
            stop.set()
            await holder

        asyncio.run(phase_b())
        deadline = time.monotonic() + 30  # the slots and the pool empty once the clients go
        while time.monotonic() < deadline:
            running = sum(gw.metric("balanceroute_gateway_rank_running_requests", rank=str(g))
                          for g in range(RANKS))  # fmt: skip
            if running == 0 and gw.metric("balanceroute_gateway_pool_size") == 0:
                break
            time.sleep(0.05)
        out["after_b"] = {"running": running, "pool": gw.metric("balanceroute_gateway_pool_size"),
                          "cancelled": gw.metric("balanceroute_gateway_requests_total",
                                                 outcome="cancelled")}  # fmt: skip
        out["after_b_completion"] = completion(gw.url, 5, stream=True)
        out["bad"] = [
            httpx.post(gw.url + path, **({"content": body} if isinstance(body, bytes) else
                                          {"json": body}), headers=headers, timeout=10)
            for path, body, headers, _ in BAD_BODIES
        ]  # fmt: skip
        out["models"] = gw.get("/v1/models")
        accepted = gw.metric("balanceroute_gateway_requests_total", outcome="accepted")
        for _ in range(100):  # the twins' process reports what it numbered within a second
            out["gw_ab"] = gw.get("/v1/ab").json()
            feed = out["gw_ab"]["twin_feed"]
            if feed["twin_requests_numbered"] + feed["twin_requests_dropped"] >= accepted:
                break
            time.sleep(0.1)
        out["gw_metrics"] = gw.get("/metrics").text
        out["gw_outcomes"] = {o: gw.metric("balanceroute_gateway_requests_total", outcome=o)
                              for o in ("accepted", "completed")}  # fmt: skip
        out["gw_pid"] = gw.proc.pid
        out["gw_exit"] = gw.stop()
        out["twin_pid_left"] = _alive(out["gw_ab"]["twin_feed"]["twin_process"]["pid"])
        gw = None
        # the switchback: two arms alternating every second
        sb = GatewayProcess(base / "sb.out", emu.urls, "--slots", str(SLOTS), "--arms",
                            f"count-jsq,brh:survival@{model}", "--switch-every", "1s",
                            "--warmup", "250ms", "--out", str(base / "sb"), env=env)  # fmt: skip
        try:
            args = ["bench", "--url", sb.url, "--preset", "azure-conv", "--requests", "200",
                    "--rate-scale", "8", "--out", str(base / "sb-bench"), "--request-timeout",
                    "60", "--no-progress"]  # fmt: skip
            assert balanceroute_main(args) == 0
            out["ab_live"] = sb.get("/v1/ab").json()
            arm = f"brh:survival@{model}"
            for _ in range(600):  # the twins catch up in their thread (a few seconds)
                ab = sb.get("/v1/ab").json()
                cf = ab["twin_comparison"] or {}
                if ab["twins"][arm]["twin_decisions"] >= 1 and cf.get("blocks", 0) >= 1:
                    break
                time.sleep(0.1)
            out["ab_twin"] = ab
            out["sb_metrics"] = sb.get("/metrics").text
        finally:
            out["sb_exit"] = sb.stop()
    finally:
        if gw is not None:
            gw.stop()
        emu.stop()
    out["iterations"], out["emu_requests"] = read_log(base / "emu-log")
    out["bench"] = pd.read_json(base / "bench" / "summary.json", typ="series")
    out["bench_requests"] = pd.read_parquet(base / "bench" / "requests.parquet")
    yield out


def test_every_request_completes_once_with_its_tokens_streaming_and_not(live):
    s, req = live["bench"], live["bench_requests"]
    assert s["completed"] == 60 and s["failed"] == 0
    assert (req["token_events"] == req["max_tokens"]).all()
    assert (req["output_tokens"] == req["max_tokens"]).all()
    for r, n in zip(live["whole"], (3, 17, 40), strict=True):
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["usage"]["completion_tokens"] == n
        assert body["choices"][0]["text"] == " the" * n
        assert body["choices"][0]["finish_reason"] == "length"
    # the emulator ran each request once: bench's ids and the non-streaming ones, no duplicate
    emu = live["emu_requests"]
    emu = emu[emu["arrival_iter"] < live["phase_a_end"]]
    ids = emu[emu["request_id"].str.startswith(("bench-", "whole-"))]["request_id"]
    assert ids.is_unique and len(ids) == 63


def test_never_more_than_b_in_flight_per_rank(live):
    it = live["iterations"]
    phase_a = it[it["iteration"] < live["phase_a_end"]]
    running = rank_matrix(phase_a, "running")
    waiting = rank_matrix(phase_a, "waiting")
    assert (running + waiting).max() <= SLOTS
    assert running.max() == SLOTS, "the test should fill a rank"
    assert live["peak"] <= SLOTS
    assert live["after_a"]["running"] == 0


def test_reload_under_traffic_fails_no_request(live):
    assert len(live["reloads"]) == 4
    for r in live["reloads"]:
        assert [x["status"] for x in r["results"]] == ["swapped"], r
    assert live["bench"]["failed"] == 0


def test_full_pool_answers_429_and_clients_that_leave_free_their_slots(live):
    full = live["full"]
    assert full.status_code == 429 and full.headers["retry-after"] == "1"
    assert full.json()["error"]["code"] == 429
    assert live["pool_when_full"] == POOL
    after = live["after_b"]
    assert after["running"] == 0 and after["pool"] == 0
    assert after["cancelled"] >= RANKS * SLOTS + POOL
    r = live["after_b_completion"]
    assert r.status_code == 200 and token_events(r.text) == 5
    emu = live["emu_requests"]
    long = emu[emu["max_tokens"] == 5000]
    assert len(long) >= RANKS * SLOTS  # the pool's never reached a rank unless admitted
    assert (long["finish_reason"] == "abort").all() and (long["generated"] < 5000).all()


def test_bad_bodies_get_4xx(live):
    for (path, body, _, status), resp in zip(BAD_BODIES, live["bad"], strict=True):
        assert resp.status_code == status, (path, body, resp.text)
        error = resp.json()["error"]  # vLLM's body, the gateway's errors and the rank's alike
        assert {"message", "type", "param", "code"} <= set(error) and error["message"]
    assert live["models"].status_code == 200
    assert live["models"].json()["data"][0]["id"] == "balanceroute-emulator"


def test_completion_log_reads_back_and_trains(live, capsys):
    folder = live["base"] / "gw" / "completions"
    assert live["gw_exit"] in STOPPED
    assert balanceroute_main(["trace", "inspect", str(folder), "--json"]) == 0
    inspected = json.loads(capsys.readouterr().out)
    assert inspected["rows"] == 64 and inspected["format"] == "canonical"  # 60 + 3 + 1
    trace = load_trace(folder)
    assert len(trace) == 64
    bench = live["bench_requests"].set_index("request_id")
    logged = trace.set_index("request_id").loc[bench.index]
    assert (logged["output_tokens"] == bench["max_tokens"]).all()
    assert (logged["prompt_tokens"] == bench["prompt_tokens"]).all()  # the rank's usage
    est = build_estimator(EstimatorSpec("gbdt"), history=trace, horizon=16)
    assert est.fitted_


def test_switchback_report_has_both_arms(live):
    folder = live["base"] / "sb" / "ab"
    assert live["sb_exit"] in STOPPED
    summary = json.loads((folder / "summary.json").read_text())
    arms = ["count-jsq", f"brh:survival@{live['model']}"]
    assert summary["arms"] == arms
    assert all(summary["per_arm"][a]["windows"] >= 1 for a in arms)
    assert summary["per_arm"][arms[1]]["router_step_p50_us"] > 0
    report = (folder / "report.md").read_text()
    assert all(f"`{a}`" in report for a in arms)
    assert live["ab_live"]["windows_done"] >= 2
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{live['base'] / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("balanceroute-gateway-ab")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 3  # the parent and one child per arm
    assert {r.data.tags["mlflow.runName"] for r in runs} == {*arms, "gateway-ab-sb"}


def test_the_twins_advance_from_the_requests_lives_and_are_in_metrics(live):
    """Phase A/B: the one arm's twin numbered every finished request (and dropped the others)
    and waits for a block at w = 0; the switchback: the BR-H arm's twin judged blocks, the
    counterfactual replayed both arms, and the report says whether it agrees."""
    ab, outcomes = live["gw_ab"], live["gw_outcomes"]
    assert set(ab["twins"]) == {"brh"} and ab["twins"]["brh"]["twin_weight"] == 0.0
    feed = ab["twin_feed"]
    assert feed["twin_requests_numbered"] == outcomes["completed"]
    assert feed["twin_requests_dropped"] >= 1  # the clients that walked away in phase B
    assert feed["twin_requests_numbered"] + feed["twin_requests_dropped"] == outcomes["accepted"]
    assert 'balanceroute_gateway_twin_weight{arm="brh"} 0.0' in live["gw_metrics"]
    process = feed["twin_process"]  # the replays ran in a child, gone with the gateway
    assert process["state"] == "running" and process["pid"] not in (None, live["gw_pid"])
    assert "balanceroute_gateway_twin_process_up 1.0" in live["gw_metrics"]
    assert not live["twin_pid_left"]
    arm = f"brh:survival@{live['model']}"
    sb = live["ab_twin"]
    assert set(sb["twins"]) == {arm}
    assert sb["twins"][arm]["twin_decisions"] >= 1 and sb["twins"][arm]["twin_cpu_s"] > 0
    assert sb["twin_comparison"]["blocks"] >= 1
    assert sb["twin_agreement"][arm]["verdict"] in ("agree", "disagree", "undecided")
    for name in ("weight", "blocks", "switches", "cpu_seconds", "lag_blocks"):
        assert f'balanceroute_gateway_twin_{name}{{arm="{arm}"}}' in live["sb_metrics"]
    worker = re.search(
        r"^balanceroute_gateway_twin_worker_cpu_seconds (\S+)$", live["sb_metrics"], re.M
    )
    assert worker is not None and float(worker.group(1)) > 0  # the twins' and the comparison's
    blocks = re.search(
        r"^balanceroute_gateway_twin_comparison_blocks (\S+)$", live["sb_metrics"], re.M
    )
    assert blocks is not None and float(blocks.group(1)) >= 1
    summary = json.loads((live["base"] / "sb" / "ab" / "summary.json").read_text())
    assert summary["twin_comparison"]["reference"] == "count-jsq"
    assert "counterfactual" in (live["base"] / "sb" / "ab" / "report.md").read_text()


@pytest.mark.slow
def test_completion_log_trains_with_the_train_command(live, tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'm.db'}")
    folder = live["base"] / "gw" / "completions"
    args = [
        "train",
        "--trace",
        str(folder),
        "--estimators",
        "survival",
        "--out",
        str(tmp_path / "a"),
    ]
    assert balanceroute_main(args) == 0


# ---- faults ---------------------------------------------------------------------------------


@pytest.fixture
def three_ranks(tmp_path: Path) -> Iterator[list[Emulator]]:
    emus = [Emulator(tmp_path / f"emu{g}.out", ranks=1, slots=2, time_scale=10.0) for g in range(3)]
    try:
        yield emus
    finally:
        for e in emus:
            if e.proc.poll() is None:
                os.kill(e.proc.pid, signal.SIGCONT)
            e.stop()


def test_a_killed_rank_loses_no_request_that_had_not_started(three_ranks, tmp_path):
    emus = three_ranks
    urls = [e.urls[0] for e in emus]
    gw = GatewayProcess(tmp_path / "gw.out", urls, "--slots", "2", "--router", "count-jsq")
    try:

        async def scenario() -> dict[str, Any]:
            res: dict[str, Any] = {}
            async with httpx.AsyncClient(timeout=60.0) as client:

                async def stream(i: int, n: int, started: asyncio.Event | None) -> str:
                    body = {"prompt": f"p {i}", "max_tokens": n, "ignore_eos": True, "stream": True}
                    text = []
                    async with client.stream("POST", gw.url + "/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            text.append(line)
                            if started is not None and line.startswith("data: {"):
                                started.set()
                    return "\n".join(text)

                begun = [asyncio.Event() for _ in range(3)]
                longs = [asyncio.create_task(stream(i, 50_000, begun[i])) for i in range(3)]
                await asyncio.gather(*(e.wait() for e in begun))  # one long stream per rank
                os.kill(emus[2].proc.pid, signal.SIGSTOP)  # rank 2 hangs: nothing comes back
                shorts = [asyncio.create_task(stream(10 + i, 30, None)) for i in range(6)]
                deadline = time.monotonic() + 30  # until a short request is forwarded to rank 2
                while time.monotonic() < deadline and await asyncio.to_thread(
                    gw.metric, "balanceroute_gateway_rank_running_requests", rank="2"
                ) < 2:
                    await asyncio.sleep(0.05)
                os.kill(emus[2].proc.pid, signal.SIGKILL)
                finished, _ = await asyncio.wait(longs, timeout=30, return_when="FIRST_COMPLETED")
                res["long_on_2"] = [t.result() for t in finished]
                for t in longs:
                    t.cancel()
                res["shorts"] = await asyncio.wait_for(asyncio.gather(*shorts), 60)
                res["after"] = await asyncio.gather(*(stream(20 + i, 10, None) for i in range(4)))
            return res

        res = asyncio.run(scenario())
        for text in res["shorts"] + res["after"]:
            assert text.rstrip().endswith("data: [DONE]"), text[-300:]
            assert "error" not in text
        assert [token_events(t) for t in res["shorts"]] == [30] * 6
        [long_on_2] = res["long_on_2"]  # the long stream on rank 2 ended, with an error event
        assert '"error"' in long_on_2 and "rank 2 failed" in long_on_2
        assert gw.metric("balanceroute_gateway_reroutes_total", rank="2") >= 1
        assert gw.metric("balanceroute_gateway_rank_healthy", rank="2") == 0
        assert gw.get("/readyz").status_code == 200
    finally:
        gw.stop()


def test_header_mode_pins_each_request_to_its_rank(tmp_path):
    emu = Emulator(tmp_path / "emu.out", ranks=3, slots=2, time_scale=20.0,
                   rank_header="X-data-parallel-rank")  # fmt: skip
    gw = None
    try:
        gw = GatewayProcess(tmp_path / "gw.out", [emu.urls[0]], "--slots", "2", "--ranks", "3",
                            "--rank-header", "X-data-parallel-rank", "--router", "count-jsq")  # fmt: skip

        def one(i: int) -> httpx.Response:
            return completion(gw.url, 20, stream=bool(i % 2), prompt=f"x {i}")

        threads_out: list[httpx.Response] = []
        ts = [threading.Thread(target=lambda i=i: threads_out.append(one(i))) for i in range(9)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        assert all(r.status_code == 200 for r in threads_out)
        ranks = emu.state()["ranks"]
        tokens = np.array([r["generation_tokens"] for r in ranks])
        assert tokens.sum() == 9 * 20 and (tokens > 0).all()  # every rank got some
    finally:
        if gw is not None:
            gw.stop()
        emu.stop()

"""The split gateway (``--relay-workers N``) end to end with real processes: the one-process
gateway's fault scenarios run again against it, and a relay worker killed with SIGKILL mid-run
has its streams' slots freed while the rest keep serving."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import psutil
import pytest

from tests.serving.gateway import test_answers_live as answers
from tests.serving.gateway.fake_ranks import FakeRank
from tests.serving.gateway.helpers import GatewayProcess, token_events
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server


class SplitGateway(GatewayProcess):
    """``balanceroute gateway --relay-workers N``."""

    workers = 1

    def __init__(self, log: Path, ranks: list[str], *args: str, env: dict | None = None) -> None:
        super().__init__(log, ranks, *args, "--relay-workers", str(self.workers), env=env)

    def relay_pids(self) -> list[int]:
        return [c.pid for c in psutil.Process(self.proc.pid).children()]

    def client_connections(self, pid: int) -> int:
        """Clients connected to relay worker ``pid``."""
        return sum(1 for c in psutil.Process(pid).net_connections("tcp")
                   if c.laddr and c.laddr.port == self.port and c.status == "ESTABLISHED")  # fmt: skip


@pytest.fixture
def split(monkeypatch: pytest.MonkeyPatch) -> None:
    """The one-process scenarios of ``test_answers_live`` against the split gateway."""
    monkeypatch.setattr(answers, "GatewayProcess", SplitGateway)


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRank]:
    rank = FakeRank(tmp_path / "fake.out")
    try:
        yield rank
    finally:
        rank.stop()


@pytest.mark.slow  # about 40 s on two busy cores: with -m slow
def test_answers_fields_aborts_and_log(split, fake, tmp_path):
    answers.test_answers_keep_the_ranks_fields_and_the_log_stays_clean(fake, tmp_path)


@pytest.mark.slow
def test_deadlines_reroute_and_end_streams(split, fake, tmp_path):
    answers.test_deadlines_reroute_before_the_first_token_and_end_the_stream_after(fake, tmp_path)


@pytest.mark.slow
def test_sigterm_drains_through_the_workers(split, fake, tmp_path):
    answers.test_sigterm_drains_streams_and_ends_the_rest_with_done(fake, tmp_path)


def test_streams_usage_and_whole_answers_as_the_one_process_gateway(tmp_path):
    """Token counts, the usage chunk only when asked, whole answers, x-request-id, the
    completion log, the probes and metrics passed to the decider."""
    emu = Emulator(tmp_path / "emu.out", ranks=2, slots=4, time_scale=20.0)
    gw = SplitGateway(tmp_path / "gw.out", emu.urls, "--slots", "4", "--router", "brh",
                      "--no-mlflow", "--out", str(tmp_path / "gw"))  # fmt: skip
    try:
        body = {"prompt": "hi", "max_tokens": 40, "ignore_eos": True, "stream": True}
        r = gw.post("/v1/completions", json=body, headers={"x-request-id": "rid-1"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "rid-1"
        assert token_events(r.text) == 40 and '"usage"' not in r.text
        assert r.text.rstrip().endswith("data: [DONE]")
        body["stream_options"] = {"include_usage": True}
        r = gw.post("/v1/completions", json=body)
        assert token_events(r.text) == 40 and '"completion_tokens":40' in r.text
        chat = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9,
                "ignore_eos": True}  # fmt: skip
        r = gw.post("/v1/chat/completions", json=chat)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 9
        assert gw.post("/v1/completions", json={"prompt": 3}).status_code == 400
        assert gw.get("/readyz").json()["status"] == "ready"
        assert gw.metric("balanceroute_gateway_requests_total", outcome="completed") == 3
    finally:
        assert gw.stop() in (0, -signal.SIGTERM)
        emu.stop()
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("*.parquet"))
    assert sorted(log["output_tokens"]) == [9, 40, 40]
    assert "Traceback" not in gw.log()


class TwoWorkers(SplitGateway):
    workers = 2


def test_a_killed_relay_worker_frees_its_slots_and_the_rest_keep_serving(tmp_path):
    """SIGKILL to one of two relay workers while 8 long streams run: its clients lose their
    streams, the decider frees those slots within one health interval (1 s), the other
    worker's streams finish whole, the worker is started again, and every request sent after
    the kill is answered."""
    emu = Emulator(tmp_path / "emu.out", ranks=2, slots=4, time_scale=20.0)
    gw = TwoWorkers(tmp_path / "gw.out", emu.urls, "--slots", "4", "--router", "count-jsq",
                    "--no-mlflow")  # fmt: skip
    res: dict[str, Any] = {}

    def running() -> float:
        return sum(gw.metric("balanceroute_gateway_rank_running_requests", rank=str(g))
                   for g in range(2))  # fmt: skip

    async def scenario() -> None:
        # one connection per stream: the kernel spreads them over both workers
        async def stream(i: int, n: int, begun: asyncio.Event | None) -> str:
            async with httpx.AsyncClient(timeout=120.0) as client:
                body = {"prompt": f"p {i}", "max_tokens": n, "ignore_eos": True, "stream": True}
                lines = []
                try:
                    async with client.stream("POST", gw.url + "/v1/completions", json=body) as r:
                        async for line in r.aiter_lines():
                            lines.append(line)
                            if begun is not None:
                                begun.set()
                except httpx.HTTPError as exc:
                    return "LOST " + type(exc).__name__
                return "\n".join(lines)

        begun = [asyncio.Event() for _ in range(8)]
        longs = [asyncio.create_task(stream(i, 2500, begun[i])) for i in range(8)]
        await asyncio.wait_for(asyncio.gather(*(b.wait() for b in begun)), 60)
        held = {pid: gw.client_connections(pid) for pid in gw.relay_pids()}
        victim = max(held, key=lambda pid: held[pid])
        res["held"] = held[victim]
        os.kill(victim, signal.SIGKILL)
        t0 = time.monotonic()
        done, _ = await asyncio.wait(longs, timeout=1.0)
        lost = sum(1 for t in done if t.result().startswith("LOST"))
        await asyncio.sleep(max(0.0, t0 + 1.0 - time.monotonic()))
        res["lost_by_1s"] = lost
        res["running_after_1s"] = await asyncio.to_thread(running)
        res["still_open"] = sum(1 for t in longs if not t.done())
        res["longs"] = await asyncio.wait_for(asyncio.gather(*longs), 120)
        res["after"] = await asyncio.gather(*(stream(100 + i, 20, None) for i in range(8)))
        res["victim"] = victim
        res["restarted"] = len(gw.relay_pids())

    try:
        asyncio.run(scenario())
        assert res["victim"] not in gw.relay_pids() and res["restarted"] == 2
    finally:
        gw.stop()
        emu.stop()
    lost = [t for t in res["longs"] if t.startswith("LOST")]
    whole = [t for t in res["longs"] if not t.startswith("LOST")]
    assert len(lost) == res["held"] >= 1  # exactly the killed worker's streams were lost
    assert res["lost_by_1s"] == len(lost)
    # within one health interval the decider counts only the streams still open
    assert res["running_after_1s"] <= res["still_open"]
    for text in whole + res["after"]:
        assert text.rstrip().endswith("data: [DONE]") and '"error"' not in text, text[-300:]
    assert [token_events(t) for t in whole] == [2500] * len(whole)
    assert [token_events(t) for t in res["after"]] == [20] * 8
    assert f"(pid {res['victim']}) exited" in gw.log() and "starting it again" in gw.log()

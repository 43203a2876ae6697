"""What a front router asks a gateway, live: SGLang's ``/get_load`` (the group's running and
waiting requests and KV tokens, one entry per rank), ``/get_server_info`` and
``/get_model_info`` (the ranks' model by name), ``--get-load load`` (vllm-router's shape), and
the same paths through a relay worker (``--relay-workers 1``), which passes them to the
gateway's app as the front in one process does)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.poll import until
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server
RANKS, SLOTS, WAITING = 2, 2, 3
STREAMS = RANKS * SLOTS + WAITING


async def _hold(url: str, opened: list[int], stop: asyncio.Event) -> None:
    """Open STREAMS long streams, keep them until ``stop``, then walk away."""
    async with httpx.AsyncClient(timeout=60.0) as client:

        async def one(i: int) -> None:
            body = {"prompt": f"word {i} " * (10 + i), "max_tokens": 5000, "ignore_eos": True,
                    "stream": True}  # fmt: skip
            async with client.stream("POST", url + "/v1/completions", json=body) as r:
                opened.append(r.status_code)
                await stop.wait()

        tasks = [asyncio.create_task(one(i)) for i in range(STREAMS)]
        await stop.wait()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    base: Path = tmp_path_factory.mktemp("front")
    emu = Emulator(base / "emu.out", ranks=RANKS, slots=SLOTS, time_scale=1.0)
    gws: list[GatewayProcess] = []
    try:
        gws.append(GatewayProcess(base / "gw.out", emu.urls, "--slots", str(SLOTS), "--router",
                                  "count-jsq", "--no-mlflow", "--out", str(base / "gw")))  # fmt: skip
        gws.append(GatewayProcess(base / "gw2.out", emu.urls, "--slots", str(SLOTS), "--router",
                                  "count-jsq", "--no-mlflow", "--get-load", "load",
                                  "--out", str(base / "gw2")))  # fmt: skip
        gws.append(GatewayProcess(base / "gw3.out", emu.urls, "--slots", str(SLOTS), "--router",
                                  "count-jsq", "--no-mlflow", "--relay-workers", "1",
                                  "--out", str(base / "gw3")))  # fmt: skip
        gw = gws[0]
        out: dict[str, Any] = {"idle": gw.get("/get_load").json(),
                               "idle_load": gws[1].get("/get_load").json(),
                               "idle_workers": gws[2].get("/get_load").json(),
                               "info_workers": gws[2].get("/get_server_info")}  # fmt: skip
        opened: list[int] = []
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        holder = threading.Thread(
            target=lambda: loop.run_until_complete(_hold(gw.url, opened, stop))
        )
        holder.start()
        try:

            def busy() -> list[dict[str, int]] | None:
                entries = gw.get("/get_load").json()
                full = sum(e["num_reqs"] for e in entries) == STREAMS
                return entries if full and all(e["num_tokens"] > 0 for e in entries) else None

            out["busy"] = until(busy)
            # the ranks start a forwarded request at their next iteration: wait for them
            running = lambda: emu.metrics("vllm:num_requests_running")  # noqa: E731
            until(lambda: running() == RANKS * SLOTS)
            out["emulator_running"] = running()
        finally:
            loop.call_soon_threadsafe(stop.set)
            holder.join(30)
        for path in ("/get_server_info", "/server_info", "/get_model_info", "/model_info"):
            out[path] = gw.get(path)
        out["models"] = gw.get("/v1/models").json()
        yield out
    finally:
        for g in gws:
            g.stop()
        emu.stop()


def test_an_idle_group_reports_no_load_in_either_shape(seen):
    assert [e["dp_rank"] for e in seen["idle"]] == list(range(RANKS))
    assert all(e["num_reqs"] == e["num_waiting_reqs"] == e["num_tokens"] == 0 for e in seen["idle"])
    assert seen["idle_load"] == {"load": 0}
    assert seen["idle_workers"] == seen["idle"]  # a relay worker passes them on too


def test_a_relay_worker_passes_the_front_router_paths_too(seen):
    info = seen["info_workers"]
    assert info.status_code == 200
    assert info.json()["served_model_name"] == seen["models"]["data"][0]["id"]


def test_get_load_counts_running_and_waiting_requests_and_their_tokens(seen):
    busy = seen["busy"]
    assert busy, "the gateway never reported the held streams"
    assert sum(e["num_reqs"] for e in busy) == STREAMS
    assert sum(e["num_waiting_reqs"] for e in busy) == WAITING  # the pool, spread over ranks
    running = [e["num_reqs"] - e["num_waiting_reqs"] for e in busy]
    assert running == [SLOTS] * RANKS  # what the gateway holds in flight on each rank
    assert seen["emulator_running"] == RANKS * SLOTS  # and the engines agree
    assert all(e["num_tokens"] > 0 for e in busy)


def test_server_and_model_info_name_the_ranks_model(seen):
    name = seen["models"]["data"][0]["id"]
    for path in ("/get_server_info", "/server_info"):
        info = seen[path].json()
        assert seen[path].status_code == 200
        assert info["served_model_name"] == info["model_path"] == name
        assert info["dp_size"] == RANKS and info["max_running_requests"] == RANKS * SLOTS
    for path in ("/get_model_info", "/model_info"):
        assert seen[path].status_code == 200 and seen[path].json()["model_path"] == name

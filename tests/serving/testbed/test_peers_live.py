"""The real peer routers in front of the emulator, and in front of two gateways.

Needs ``sglang-router`` and ``vllm-router`` from ``scripts/install_peers.sh`` (a cached virtual
environment outside the clone, or ``$BALANCEROUTE_PEERS_BIN``); skipped with that reason when
they are not installed, since they are no dependency of the project and the suite installs
nothing. Checks what the routers make of the emulator's engine endpoints: ``sglang-router``
registers the served model (not ``unknown``) and reads every worker's load, ``vllm-router``
reads the loads in its shape and renders prompts for ``cache_aware``; and the README's
horizontal topology: a peer router spreading requests over two groups' gateways.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port
from tests.poll import until
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server


def peers_bin() -> Path | None:
    """The folder with both peer routers, if installed."""
    given = os.environ.get("BALANCEROUTE_PEERS_BIN")
    cache = Path(
        os.environ.get("BALANCEROUTE_PEERS_CACHE", Path.home() / ".cache/balanceroute/peers")
    )
    found = (
        [Path(given)]
        if given
        else sorted(p.parent / "bin" for p in cache.glob("venv-*/.installed"))
    )
    for folder in reversed(found):
        if (folder / "sglang-router").exists() and (folder / "vllm-router").exists():
            return folder
    return None


PEERS = peers_bin()
needs_peers = pytest.mark.skipif(
    PEERS is None, reason="sglang-router / vllm-router not installed: run scripts/install_peers.sh"
)


class Peer:
    """One peer router process in front of ``workers``."""

    def __init__(self, kind: str, policy: str, workers: list[str], log: Path, *extra: str) -> None:
        assert PEERS is not None
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        common = ["--host", "127.0.0.1", "--port", str(self.port), "--policy", policy,
                  "--worker-startup-check-interval", "1", *extra, "--worker-urls", *workers]  # fmt: skip
        if "--prometheus-port" not in extra:  # both default to 29000: one router a machine
            common = ["--prometheus-port", str(free_port()), *common]
        if kind == "sglang":
            args = [str(PEERS / "sglang-router"), "launch", *common]
        else:
            args = [str(PEERS / "vllm-router"), *common]
        # its own session: sglang-router forks the router, which a stop must reach too
        self.process = ServerProcess(args, log=log, env=clean_env(), group=True)
        self.process.wait_ready([self.url + "/health"], timeout_s=120)
        self.workers = self.wait_workers(len(workers))

    def wait_workers(self, n: int, timeout_s: float = 60.0) -> list[dict]:
        """``GET /workers`` once it lists ``n`` workers."""

        def listed() -> list[dict]:
            workers = httpx.get(self.url + "/workers", timeout=5.0).json().get("workers", [])
            return workers if len(workers) >= n else []

        return until(listed, timeout_s, f"{self.url} lists {n} workers", poll_s=0.1)

    def loads(self) -> list[int]:
        return [
            w["load"] for w in httpx.get(self.url + "/get_loads", timeout=5.0).json()["workers"]
        ]

    def stop(self) -> None:
        self.process.terminate(20)


def complete(url: str, n: int = 3) -> httpx.Response:
    body = {"model": "balanceroute-emulator", "prompt": "hello there friend", "max_tokens": n,
            "ignore_eos": True, "stream": False}  # fmt: skip
    return httpx.post(url + "/v1/completions", json=body, timeout=60.0)


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = Emulator(tmp_path_factory.mktemp("peers") / "emu.out", ranks=2, slots=2,
                      time_scale=20.0)  # fmt: skip
    yield server
    server.stop()


@needs_peers
def test_sglang_router_registers_the_model_and_reads_loads(emu: Emulator, tmp_path: Path):
    peer = Peer("sglang", "power_of_two", emu.urls, tmp_path / "router.out")
    try:
        assert {w["model_id"] for w in peer.workers} == {"balanceroute-emulator"}
        assert complete(peer.url).status_code == 200
        assert all(load >= 0 for load in peer.loads())  # -1: the worker's /get_load failed
    finally:
        peer.stop()


@needs_peers
def test_vllm_router_reads_its_load_shape_and_renders(tmp_path: Path):
    emu = Emulator(tmp_path / "emu.out", ranks=2, slots=2, time_scale=20.0, get_load="load")
    prom = free_port()
    peers = []
    try:
        p2 = Peer("vllm", "power_of_two", emu.urls, tmp_path / "p2.out")
        peers.append(p2)
        assert all(load >= 0 for load in p2.loads())
        cache = Peer("vllm", "cache_aware", emu.urls, tmp_path / "ca.out",
                     "--prometheus-port", str(prom))  # fmt: skip
        peers.append(cache)
        for _ in range(3):
            assert complete(cache.url).status_code == 200
        text = httpx.get(f"http://127.0.0.1:{prom}/metrics", timeout=5.0).text
        samples = parse_metrics(text)
        assert metric_total(samples, "vllm_router_kv_routing_inputs_total", result="render") >= 3
        for failed in ("invalid_preparation_response", "render_unavailable"):  # a 404 is the first
            assert metric_total(samples, "vllm_router_kv_routing_inputs_total", result=failed) == 0
        assert metric_total(samples, "vllm_router_prefix_routing_decisions_total",
                            outcome="missing_tokens") == 0  # fmt: skip
    finally:
        for p in peers:
            p.stop()
        emu.stop()


@needs_peers
def test_a_load_aware_front_router_reads_the_gateways_loads_and_model(tmp_path: Path):
    """sglang-router's power_of_two in front of two groups' gateways: the model by name (not
    ``unknown``, from each gateway's /get_server_info) and each group's load (its /get_load)."""
    emus = [Emulator(tmp_path / f"emu{g}.out", ranks=2, slots=2, time_scale=20.0) for g in (0, 1)]
    gateways, peer = [], None
    try:
        for g, emu in enumerate(emus):
            gateways.append(GatewayProcess(tmp_path / f"gw{g}.out", emu.urls, "--slots", "2",
                                           "--no-mlflow", "--out", str(tmp_path / f"gw{g}")))  # fmt: skip
        peer = Peer("sglang", "power_of_two", [gw.url for gw in gateways], tmp_path / "front.out")
        assert {w["model_id"] for w in peer.workers} == {"balanceroute-emulator"}
        for _ in range(4):
            assert complete(peer.url).status_code == 200
        assert all(load >= 0 for load in peer.loads())  # -1: a gateway's /get_load failed
    finally:
        if peer is not None:
            peer.stop()
        for gw in gateways:
            gw.stop()
        for emu in emus:
            emu.stop()


@needs_peers
@pytest.mark.slow  # two groups and their gateways: test_horizontal.py checks the topology anyway
def test_a_peer_router_in_front_of_two_groups_gateways(tmp_path: Path):
    emus = [Emulator(tmp_path / f"emu{g}.out", ranks=2, slots=2, time_scale=20.0) for g in (0, 1)]
    gateways, peer = [], None
    try:
        for g, emu in enumerate(emus):
            gateways.append(GatewayProcess(tmp_path / f"gw{g}.out", emu.urls, "--slots", "2",
                                           "--no-mlflow", "--out", str(tmp_path / f"gw{g}")))  # fmt: skip
        peer = Peer("sglang", "round_robin", [gw.url for gw in gateways], tmp_path / "front.out")
        for _ in range(6):
            r = complete(peer.url)
            assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        served = [emu.state()["accepted"] for emu in emus]
        assert sum(served) == 6 and min(served) >= 1
    finally:
        if peer is not None:
            peer.stop()
        for gw in gateways:
            gw.stop()
        for emu in emus:
            emu.stop()

"""Several decode groups, each with its own gateway, behind one front: nothing crosses groups.

Two emulated groups, a gateway in front of each (its own ``--out``), and ``bench`` as the front
spreading one workload over the two gateways. Each gateway's completion log must hold exactly
the requests its own group ran (by ``x-request-id``, as the emulators log them), the two logs
must be disjoint and together hold every request, and every logged rank is one of its own
group's. The README's horizontal section runs the same topology with a peer router in front
(``test_peers_live.py`` checks that one when the peers are installed).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pandas as pd
import pytest

from balanceroute.cli import main as balanceroute_main
from balanceroute.serving.testbed.emulator.iterlog import read_log
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server
RANKS, SLOTS, REQUESTS = 2, 2, 24


def completion_log(folder: Path) -> pd.DataFrame:
    """Every row of a gateway's completion log, its own columns (the rank too)."""
    return pd.concat([pd.read_parquet(p) for p in sorted(folder.glob("part-*.parquet"))])


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the two groups, stop everything (the logs are written then), keep what they wrote."""
    base = tmp_path_factory.mktemp("horizontal")
    emus, gateways = [], []
    try:
        for name in ("a", "b"):
            emus.append(Emulator(base / f"emu-{name}.out", ranks=RANKS, slots=SLOTS,
                                 time_scale=20.0, log_dir=str(base / f"emu-{name}")))  # fmt: skip
        for name, emu in zip(("a", "b"), emus, strict=True):
            gateways.append(GatewayProcess(base / f"gw-{name}.out", emu.urls, "--slots", str(SLOTS),
                                           "--router", "count-jsq", "--no-mlflow",
                                           "--out", str(base / f"gw-{name}")))  # fmt: skip
        health = [httpx.get(gw.url + "/health", timeout=5.0) for gw in gateways]
        args = ["bench", "--url", gateways[0].url, "--url", gateways[1].url, "--preset",
                "azure-conv", "--requests", str(REQUESTS), "--rate-scale", "40", "--out",
                str(base / "bench"), "--request-timeout", "60", "--no-progress"]  # fmt: skip
        assert balanceroute_main(args) == 0
    finally:
        for gw in gateways:
            gw.stop()
        for emu in emus:
            emu.stop()
    yield {
        "health": health,
        "bench": pd.read_json(base / "bench" / "summary.json", typ="series"),
        "bench_ids": set(pd.read_parquet(base / "bench" / "requests.parquet")["request_id"]),
        "logs": {n: completion_log(base / f"gw-{n}" / "completions") for n in ("a", "b")},
        "ran": {n: read_log(base / f"emu-{n}")[1] for n in ("a", "b")},
        "base": base,
    }


def test_a_gateway_answers_the_probe_front_routers_poll(groups):
    """sglang-router and vllm-router poll a worker's /health (vLLM's) before routing to it."""
    assert [r.status_code for r in groups["health"]] == [200, 200]
    assert all(r.json()["status"] == "ready" for r in groups["health"])


def test_every_request_completes_once_somewhere(groups):
    assert groups["bench"]["completed"] == REQUESTS and groups["bench"]["failed"] == 0
    a, b = (set(groups["logs"][n]["request_id"]) for n in ("a", "b"))
    assert a and b, "the front sent every request to one group"
    assert not a & b
    assert a | b == groups["bench_ids"]


def test_each_gateway_logs_only_what_its_own_group_ran(groups):
    for name in ("a", "b"):
        logged = groups["logs"][name]
        ran = groups["ran"][name]
        ran = ran[ran["request_id"].str.startswith("bench-")]
        assert set(logged["request_id"]) == set(ran["request_id"])
        assert ran["request_id"].is_unique
        assert set(logged["worker"]) <= set(range(RANKS))
        both = logged.merge(ran, on="request_id", suffixes=("", "_rank"))
        assert len(both) == len(logged)
        assert (both["output_tokens"] == both["generated"]).all()


def test_each_gateway_keeps_its_own_log_clock(groups):
    base: Path = groups["base"]
    metas = [(base / f"gw-{n}" / "completions" / "log.json").read_text() for n in ("a", "b")]
    assert all(metas) and metas[0] != metas[1]

"""The gateway's view of the group against the engine's ground truth: a short live run through
the one-process gateway (ages from every chunk) and through one relay worker (ages from the
ranks' iteration clocks), its per-rank loads at every tick (``OUT/ticks.parquet``) compared with
the loads the emulator's iteration and request logs say the ranks held at that moment."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pandas as pd
import pytest

from balanceroute.serving.testbed.emulator.iterlog import loads_at, rank_matrix, read_log
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server
RANKS, SLOTS, N = 2, 4, 30


async def _drive(url: str, prompts: np.ndarray, lengths: np.ndarray, delays: np.ndarray) -> list:
    """Streaming completions released at ``delays``; the tokens each got."""

    async def one(i: int, client: httpx.AsyncClient) -> int:
        await asyncio.sleep(float(delays[i]))
        body = {"prompt": " ".join(["w"] * int(prompts[i])), "max_tokens": int(lengths[i]),
                "ignore_eos": True, "stream": True}  # fmt: skip
        tokens = 0
        async with client.stream("POST", url + "/v1/completions", json=body,
                                 headers={"x-request-id": f"v{i}"}) as r:  # fmt: skip
            async for line in r.aiter_lines():
                tokens += line.startswith("data: {") and '"text"' in line
        return tokens

    async with httpx.AsyncClient(timeout=300) as client:
        return await asyncio.gather(*(one(i, client) for i in range(len(prompts))))


def _view_and_truth(gw_out: Path, log: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gateway's per-rank loads at its ticks, the engine's then, and whether the tick came
    after the run's second finish (before it the relay worker's clock knows no period)."""
    ticks = pd.read_parquet(gw_out / "ticks.parquet")
    epoch = json.loads((log / "config.json").read_text())["epoch"]
    iterations, requests = read_log(log)
    t = ticks["time_s"].to_numpy() - epoch
    seen = np.stack(ticks["loads"].to_numpy()).astype(np.float64)
    truth = loads_at(iterations, requests, t, RANKS)
    # the truth at each iteration start is the iteration log's own loads
    starts = loads_at(iterations, requests, iterations["start_s"].to_numpy() + 1e-9, RANKS)
    assert np.array_equal(starts, rank_matrix(iterations, "loads"))
    second = np.sort(requests["finish_s"].to_numpy())[1]
    return seen, truth, t > second


@pytest.mark.parametrize("workers", [0, 1], ids=["one-process", "relay-worker"])
def test_the_gateways_loads_follow_the_engines(tmp_path: Path, workers: int):
    """30 requests (prompts of 20-400 words, 10-80 tokens each, released over 3 s: the pool
    fills) on 2 ranks x 4 slots at real time; at the median tick the gateway's per-rank loads
    are within 5% of the engine's (relative L1 over the ranks), at nine ticks in ten within 25%
    (a tick that falls between an admission and the rank taking it in, or between a last token
    and its finish reaching the gateway, sees a request the engine does not, or the reverse).
    Without the ages (loads of prompts alone) the error would be the ages' share of the load."""
    rng = np.random.default_rng(20)
    prompts = rng.integers(20, 400, N)
    lengths = rng.integers(10, 80, N)
    delays = np.sort(rng.uniform(0, 3.0, N))
    emu = Emulator(tmp_path / "emu.out", ranks=RANKS, slots=SLOTS, time_scale=1.0,
                   log_dir=str(tmp_path / "log"))  # fmt: skip
    extra = ["--relay-workers", str(workers)] if workers else []
    gw = None
    try:
        gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", str(SLOTS), "--router",
                            "brh:none", "--no-mlflow", "--out", str(tmp_path / "gw"),
                            "--sample", "10ms", *extra)  # a sample every tick  # fmt: skip
        got = asyncio.run(_drive(gw.url, prompts, lengths, delays))
    finally:
        if gw is not None:
            gw.stop()
        emu.stop()
    assert got == list(lengths)
    seen, truth, settled = _view_and_truth(tmp_path / "gw", tmp_path / "log")
    busy = (truth.sum(axis=1) > 0) & settled
    assert busy.sum() > 100
    err = np.abs(seen - truth).sum(axis=1)[busy] / truth.sum(axis=1)[busy]
    # the bound tells a view without ages apart: prompts alone miss the tokens streamed so far
    iterations, requests = read_log(tmp_path / "log")
    ticks_t = pd.read_parquet(tmp_path / "gw" / "ticks.parquet")["time_s"].to_numpy()
    epoch = json.loads((tmp_path / "log" / "config.json").read_text())["epoch"]
    prompts_only = loads_at(iterations, requests.assign(generated=0), ticks_t - epoch, RANKS)
    blind = np.abs(prompts_only - truth).sum(axis=1)[busy] / truth.sum(axis=1)[busy]
    assert np.median(blind) > 0.1
    print("view error p50/p90/p99:", np.percentile(err, [50, 90, 99]).round(4),
          "without ages p50:", round(float(np.median(blind)), 4))  # fmt: skip
    assert np.median(err) <= 0.05, np.percentile(err, [50, 90, 99])
    assert np.percentile(err, 90) <= 0.25, np.percentile(err, [50, 90, 99])

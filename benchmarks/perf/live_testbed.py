"""Live test bed figures: does the emulator keep real time, what it sustains, what bench adds.

Every point starts a real ``balanceroute emulate`` process (with ``--log``) and a real
``balanceroute bench`` process beside it on this machine, then reads the emulator's iteration
log. Prints JSON (also written to ``--out``)::

    .venv/bin/python benchmarks/live_testbed.py --out runs/live_testbed.json
    .venv/bin/python benchmarks/live_testbed.py --only realtime --seconds 20

Sections:

- ``ttft``: bench against one directly addressed rank (G = 2, B = 32, real time) at low load
  (4 req/s, 16-token outputs, nothing queues). Bench's TTFT of each request minus the
  emulator's own (first chunk written minus request arrival at the server, joined by
  ``x-request-id``): what the client and the loopback add.
- ``realtime``: G x B at a time scale, slots kept full for ``--seconds`` (a saturating trace:
  4 x G x B requests in the first second, prompts 500..1500 tokens, outputs 150..250, at most
  1.25 x G x B open at once, the rest held by bench). Over the iterations with at least 90% of
  the slots running (after the first 2 s): the *overrun* of each iteration, its wall interval
  (emission to emission) over the cost model's duration minus one; the *lateness* of each
  emission against its absolute deadline; the fan-out time; CPU of both processes. A point is
  sustained when the median overrun is within 5%, the median lateness at most 5% of the median
  iteration (a group that keeps falling behind alternates late and short catch-up iterations,
  so the overrun alone can look fine) and the clock never had to re-anchor.
- ``sweep``: ``realtime`` at time scale 1 for growing G x B up to 32 x 128, stopping at the first
  one not sustained (the largest sustained one is reported), and the time scale G = 16, B = 64
  needs: 1 if it keeps real time (then also the fastest of 2, 4, 8 it sustains), else the
  largest of 0.75, 0.5, 0.35, 0.25 it sustains.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log
from balanceroute.serving.testbed.harness import ServerProcess, free_ports

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SWEEP = ((8, 32), (8, 64), (16, 48), (16, 64), (32, 64), (32, 128))
SCALES_DOWN = (0.75, 0.5, 0.35, 0.25)
SCALES_UP = (2.0, 4.0, 8.0)


def write_trace(path: Path, n: int, *, rate: float | None, out_lo: int, out_hi: int, seed: int):
    """A canonical CSV trace: ``rate`` req/s Poisson (None: all within the first second)."""
    rng = np.random.default_rng(seed)
    if rate is None:
        arrival = np.sort(rng.uniform(0, 1.0, n))
    else:
        arrival = np.cumsum(rng.exponential(1 / rate, n))
    pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_s": arrival,
            "prompt_tokens": rng.integers(500, 1501, n),
            "output_tokens": rng.integers(out_lo, out_hi + 1, n),
        }
    ).to_csv(path, index=False)


class Emulator:
    """A ``balanceroute emulate`` process with its log."""

    def __init__(self, ranks: int, slots: int, scale: float, log_dir: Path) -> None:
        self.base = free_ports(ranks)
        self.urls = [f"http://127.0.0.1:{self.base + g}" for g in range(ranks)]
        args = [str(BIN / "balanceroute"), "emulate", "--ranks", str(ranks), "--slots", str(slots)]
        args += ["--time-scale", str(scale), "--port-base", str(self.base), "--log", str(log_dir)]
        self.server = ServerProcess(args, log=log_dir.parent / "emulator.out")
        self.proc = self.server.proc
        self.ps = psutil.Process(self.proc.pid)
        self.server.wait_ready([url + "/health" for url in self.urls], timeout_s=60, poll_s=0.05)

    def cpu(self) -> float:
        t = self.ps.cpu_times()
        return t.user + t.system

    def stop(self) -> None:
        self.server.terminate(timeout_s=60)


def bench(urls: list[str], trace: Path, out: Path, extra: list[str]) -> tuple[dict, float, float]:
    """Run ``balanceroute bench``; its summary, CPU seconds and wall seconds."""
    args = [str(BIN / "balanceroute"), "bench", "--trace", str(trace), "--out", str(out)]
    args += ["--no-progress", *extra]
    for u in urls:
        args += ["--url", u]
    t0 = time.monotonic()
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ps = psutil.Process(proc.pid)
    cpu = 0.0
    while proc.poll() is None:
        try:
            t = ps.cpu_times()
            cpu = t.user + t.system
        except psutil.Error:
            break
        time.sleep(0.2)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode != 0:
        raise RuntimeError(f"bench failed: {err[-2000:]}")
    return json.loads((out / "summary.json").read_text()), cpu, time.monotonic() - t0


def pct(values: np.ndarray, ps=(50, 90, 99)) -> dict[str, float]:
    if values.size == 0:
        return {}
    return {f"p{p}": round(float(np.percentile(values, p)), 4) for p in ps}


def realtime(ranks: int, slots: int, scale: float, seconds: float, work: Path) -> dict[str, Any]:
    """One saturated run; clock figures over the iterations with the slots (nearly) full."""
    base = work / f"g{ranks}-b{slots}-x{scale:g}-{len(list(work.iterdir()))}"
    base.mkdir(parents=True)
    trace = base / "trace.csv"
    write_trace(trace, 4 * ranks * slots, rate=None, out_lo=150, out_hi=250, seed=ranks * slots)
    load_before = os.getloadavg()[0]
    emu = Emulator(ranks, slots, scale, base / "log")
    cpu0 = emu.cpu()
    t0 = time.monotonic()
    extra = ["--concurrency-limit", str(int(1.25 * ranks * slots)), "--request-timeout", "600"]
    extra += ["--max-duration", str(seconds)]
    summary, bench_cpu, _ = bench(emu.urls, trace, base / "bench", extra)
    wall = time.monotonic() - t0
    emu_cpu = emu.cpu() - cpu0
    emu.stop()
    it, _ = read_log(base / "log")
    running = rank_matrix(it, "running").sum(axis=1)
    end = it["end_s"].to_numpy()
    nominal = it["duration_s"].to_numpy() / scale
    interval = np.diff(end)
    overrun = interval / nominal[1:] - 1
    full = (running[1:] >= 0.9 * ranks * slots) & (end[1:] >= end[0] + 2.0)
    late = (end - it["deadline_s"].to_numpy())[1:][full]
    fan = (it["done_s"] - it["end_s"]).to_numpy()[1:][full]
    emitted = it["emitted"].to_numpy()[1:][full]
    span = float(interval[full].sum())
    resyncs = json.loads((base / "log" / "summary.json").read_text())["resyncs"]
    med = float(np.median(overrun[full])) if full.any() else float("nan")
    return {
        "ranks": ranks,
        "slots": slots,
        "time_scale": scale,
        "iterations": len(it),
        "full_iterations": int(full.sum()),
        "nominal_ms_median": round(float(np.median(nominal[1:][full])) * 1e3, 3)
        if full.any()
        else None,
        "overrun": pct(overrun[full]),
        "overrun_mean": round(float(overrun[full].mean()), 4) if full.any() else None,
        "lateness_ms": pct(late * 1e3),
        "fanout_ms": pct(fan * 1e3),
        "resyncs": resyncs,
        "tokens_per_s_emitted": round(float(emitted.sum()) / span, 1) if span else None,
        "bench_tokens_per_s_received": round(summary["output_throughput"], 1),
        "bench_completed": summary["completed"],
        "bench_itl_ms": {
            "p50": round(summary["median_itl_ms"], 3),
            "p99": round(summary["p99_itl_ms"], 3),
        },
        "cpu_emulator": round(emu_cpu / wall, 3),
        "cpu_bench": round(bench_cpu / wall, 3),
        "sustained": bool(
            full.sum() >= 50
            and abs(med) <= 0.05
            and float(np.median(late)) <= 0.05 * float(np.median(nominal[1:][full]))
            and resyncs == 0
        ),
        "loadavg_1min": [round(load_before, 2), round(os.getloadavg()[0], 2)],
    }


def ttft(work: Path, requests: int = 60) -> dict[str, Any]:
    """Bench's TTFT against the emulator's own, on one rank at low load."""
    base = work / "ttft"
    base.mkdir(parents=True)
    trace = base / "trace.csv"
    write_trace(trace, requests, rate=4.0, out_lo=16, out_hi=16, seed=1)
    emu = Emulator(2, 32, 1.0, base / "log")
    summary, _, _ = bench(emu.urls[:1], trace, base / "bench", ["--request-timeout", "60"])
    emu.stop()
    _, emu_rq = read_log(base / "log")
    ours = pd.read_parquet(base / "bench" / "requests.parquet")
    joined = ours.merge(emu_rq, on="request_id")
    emu_ttft = (joined["first_sent_s"] - joined["recv_s"]).to_numpy()
    gap = (joined["ttft_s"].to_numpy() - emu_ttft) * 1e3
    return {
        "requests": len(joined),
        "completed": summary["completed"],
        "bench_ttft_ms": pct(joined["ttft_s"].to_numpy() * 1e3),
        "emulator_ttft_ms": pct(emu_ttft * 1e3),
        "added_ms": pct(gap),
        "added_ms_mean": round(float(gap.mean()), 4),
        "target_met": bool(np.median(gap) <= 1.0),
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--only", choices=["ttft", "realtime", "sweep"], help="one section")
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--seconds", type=float, default=30.0, help="measured run length per point")
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    load0 = os.getloadavg()
    result: dict[str, Any] = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_before": [round(x, 2) for x in load0],
        },
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
    }
    with tempfile.TemporaryDirectory(prefix="live-testbed-") as tmp:
        work = Path(tmp)
        if args.only in (None, "ttft"):
            result["ttft"] = ttft(work)
        if args.only in (None, "realtime"):
            result["realtime"] = realtime(
                args.ranks, args.slots, args.time_scale, args.seconds, work
            )
        if args.only in (None, "sweep"):
            sweep = []
            for g, b in SWEEP:
                same = result.get("realtime", {})
                if (same.get("ranks"), same.get("slots"), same.get("time_scale")) == (g, b, 1.0):
                    point = same
                else:
                    point = realtime(g, b, 1.0, args.seconds, work)
                    print(json.dumps(point), file=sys.stderr)
                sweep.append(point)
                if not point["sustained"]:
                    break
            result["sweep"] = sweep
            ok = [pt for pt in sweep if pt["sustained"]]
            best = max(ok, key=lambda pt: pt["ranks"] * pt["slots"]) if ok else None
            result["largest_sustained_at_real_time"] = (
                None if best is None else {"ranks": best["ranks"], "slots": best["slots"]}
            )
            big = next((pt for pt in sweep if (pt["ranks"], pt["slots"]) == (16, 64)), None)
            if big is None:
                big = realtime(16, 64, 1.0, args.seconds, work)
            scales = [big]
            for scale in SCALES_UP if big["sustained"] else SCALES_DOWN:
                point = realtime(16, 64, scale, args.seconds, work)
                scales.append(point)
                print(json.dumps(point), file=sys.stderr)
                if point["sustained"] != big["sustained"]:
                    break
            result["g16_b64_scales"] = [
                {
                    k: pt[k]
                    for k in ("time_scale", "overrun", "lateness_ms", "sustained", "loadavg_1min")
                }
                for pt in scales
            ]
            good = [pt["time_scale"] for pt in scales if pt["sustained"]]
            result["g16_b64_time_scale_needed"] = (
                1.0 if big["sustained"] else (max(good) if good else None)
            )
            result["g16_b64_fastest_sustained"] = max(good) if good else None
    result["machine"]["loadavg_after"] = [round(x, 2) for x in os.getloadavg()]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

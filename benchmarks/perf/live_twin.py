"""The live twin on emulated traffic: the gateway's switchback beside its twin's verdict, as JSON.

The earlier ``--train`` requests of a shared trace fit ``gbdt`` (prompt keys mapped to the keys
the gateway derives from the live prompts, as ``live_gateway.py``), saved as a local file with
no twin prior: the live twin starts at ``w = 0`` and must earn its weight on the traffic
(``--prior``: the file carries the prior ``train`` would measure, cross-fitted over two folds
in time of the training requests, each at least one block: the twin continues its test). Then a ``balanceroute emulate`` group (G = 8, B = 32, ``paper-dsv3``,
``--time-scale``) runs behind ``balanceroute gateway`` with the switchback between ``brh:none``
and ``brh:gbdt`` (default options: the twin on), and ``balanceroute bench`` replays the next
``--requests`` requests at ``--load`` times the decode capacity. Every ``--poll`` seconds the
gateway's ``/metrics`` gives the twin's weight, blocks judged, switches, CPU and lag, and
``/v1/ab`` the worker's CPU (the twin and the counterfactual comparison). Printed: the weight over
time (when it first left 0, the share of the run at each weight), the twin's CPU share of one
core, the switchback summary, the twin's counterfactual comparison and the agreement verdict, the
gateway's ``report.md``, and the offline ``balanceroute ab`` of the same arms on the same
requests (with the unguarded ``gbdt`` beside them: what ``w = 1`` is worth there).

The gateway's event loop beside it (docs/results.md, "The live twins and the event
loop"): the loop lag (``/v1/ab``'s ``loop_lag``: how late a 100 ms timer ran), the largest gap
between decision ticks (``ticks.parquet``), ``/metrics``' answer times, the ranks leaving the
rotation, with ``--twin off`` (no twins nor counterfactual: ``gbdt`` routes at its start weight)
or ``--twin-nice N`` (the twins' OS nice) to compare, and ``--base-python`` (another
installation's gateway, e.g. main's with the twins in a thread) beside this tree's.

    nice -n 5 .venv/bin/python benchmarks/perf/live_twin.py --out runs/live_twin > runs/live_twin.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from live_gateway import (
    CLI,
    DATA,
    TRACES,
    B,
    G,
    rebased,
    with_live_keys,
)

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import save_estimator
from balanceroute.router.lab.twin.prior import PriorConfig, attach_priors
from balanceroute.router.lab.twin.prior_measure import priors_for
from balanceroute.serving.testbed.harness import ServerProcess, clean_env
from balanceroute.training.crossfit import fitted_folds, time_folds

METRIC = re.compile(r'^balanceroute_gateway_(twin_\w+)\{arm="([^"]+)"\}\s+(\S+)$')


def fit_gbdt(train: pd.DataFrame, out: Path, prior: bool) -> tuple[Path, dict | None]:
    """``gbdt`` on the training requests (live keys); with ``prior``, carrying the twin prior
    for this group that ``train`` measures (two folds in time, each replayed by a copy fitted
    on the other)."""
    out.mkdir(parents=True, exist_ok=True)
    history = with_live_keys(train)
    spec = EstimatorSpec("gbdt")
    est = build_estimator(spec, history=history, horizon=DEFAULT_HORIZON)
    measured = None
    if prior:
        fit = lambda part: build_estimator(spec, history=part, horizon=DEFAULT_HORIZON)  # noqa: E731
        pairs = {"gbdt": fitted_folds(fit, time_folds(history, 2))}
        priors = priors_for(pairs, [PriorConfig(G, B)])["gbdt"]
        attach_priors(est, priors)
        measured = priors[0].as_dict()
    return save_estimator(est, out / "gbdt.joblib"), measured


def tiled(frame: pd.DataFrame, copies: int) -> pd.DataFrame:
    """``frame`` replayed ``copies`` times back to back (each copy shifted by the span plus one
    mean gap, request ids suffixed): a run longer than what the trace holds after ``--train``."""
    if copies < 1:
        raise ValueError(f"--repeat must be at least 1, got {copies}")
    if copies == 1:
        return frame
    span = float(frame["arrival_s"].iloc[-1] - frame["arrival_s"].iloc[0])
    step = span + span / max(1, len(frame) - 1)
    parts = []
    for k in range(copies):
        part = frame.copy()
        part["arrival_s"] = part["arrival_s"] + k * step
        if "request_id" in part.columns:
            part["request_id"] = part["request_id"].astype(str) + f"~{k}"
        parts.append(part)
    return pd.concat(parts, ignore_index=True)


def start_emulator(ts: float, port_base: int, out: Path) -> tuple[ServerProcess, list[str]]:
    cfg = {
        "ranks": G,
        "slots": B,
        "time_scale": ts,
        "port_base": port_base,
        "log_dir": str(out / "emulator"),
    }
    args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator", json.dumps(cfg)]
    proc = ServerProcess(args, log=out / "emulator.out")
    urls = [f"http://127.0.0.1:{port_base + g}" for g in range(G)]
    proc.wait_ready([u + "/health" for u in urls], timeout_s=180, poll_s=0.2)
    return proc, urls


def start_gateway(
    urls: list[str], port: int, extra: list[str], out: Path, python: str | None = None
) -> ServerProcess:
    """``balanceroute gateway`` of this installation, or of ``python``'s (another worktree's)."""
    cli = CLI if python is None else [python, *CLI[1:]]
    args = [*cli, "gateway", "--slots", str(B), "--port", str(port), "--out", str(out / "gateway")]
    for u in urls:
        args += ["--rank", u]
    env = clean_env({"BALANCEROUTE_LOG_LEVEL": "info"})
    proc = ServerProcess(args + extra, log=out / "gateway.out", env=env)
    proc.wait_ready([f"http://127.0.0.1:{port}/readyz"], timeout_s=180, poll_s=0.2)
    return proc


def scrape(text: str) -> dict[str, dict[str, float]]:
    """The twin gauges of a ``/metrics`` page by arm: ``{arm: {twin_weight: w, ...}}``."""
    out: dict[str, dict[str, float]] = {}
    for line in text.splitlines():
        m = METRIC.match(line)
        if m:
            out.setdefault(m.group(2), {})[m.group(1)] = float(m.group(3))
    return out


class Poller:
    """``/metrics`` every ``every_s`` and ``/v1/ab``'s twin fields every ``ab_every`` polls,
    in a thread, until stopped."""

    def __init__(self, url: str, every_s: float, ab_every: int = 6) -> None:
        self.url, self.every_s, self.ab_every = url, every_s, ab_every
        self.samples: list[dict[str, Any]] = []
        self.stopping = threading.Event()
        self.t0 = time.monotonic()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        with httpx.Client(timeout=20, trust_env=False) as client:
            while not self.stopping.is_set():
                row: dict[str, Any] = {
                    "t_s": round(time.monotonic() - self.t0, 2),
                    "loadavg_1m": os.getloadavg()[0],
                }
                try:
                    t = time.monotonic()
                    row["twins"] = scrape(client.get(self.url + "/metrics").text)
                    row["metrics_s"] = round(time.monotonic() - t, 4)
                    if n % self.ab_every == 0:
                        ab = client.get(self.url + "/v1/ab").json()
                        row["worker_cpu_s"] = ab["twin_feed"]["worker_cpu_s"]
                        row["capped_passes"] = ab["twin_feed"]["worker_capped_passes"]
                        row["windows_done"] = ab["windows_done"]
                        cf = ab.get("twin_comparison") or {}
                        row["comparison_blocks"] = cf.get("blocks")
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    row["error"] = f"{type(exc).__name__}: {exc}"
                self.samples.append(row)
                n += 1
                self.stopping.wait(self.every_s)

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(30)


def process_cpu(pid: int) -> list[dict[str, Any]]:
    """CPU seconds (user + system) of the gateway and every process under it, as the OS counts
    them (psutil): the twins' child and its fork server beside the gateway."""
    import psutil

    out = []
    try:
        root = psutil.Process(pid)
        for p in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                out.append({"pid": p.pid, "cmd": " ".join(p.cmdline())[-80:],
                            "cpu_s": round(t.user + t.system, 3)})  # fmt: skip
    except psutil.Error:
        pass
    return out


def weight_course(samples: list[dict[str, Any]], arm: str) -> dict[str, Any]:
    """The twin's weight over the polls: first time off 0, share of polls at each weight,
    the changes, blocks judged and the twin's CPU at the end."""
    rows = [(s["t_s"], s["twins"][arm]) for s in samples if arm in s.get("twins", {})]
    if not rows:
        return {"polls": 0}
    weights = np.array([r["twin_weight"] for _, r in rows])
    times = [t for t, _ in rows]
    off = np.flatnonzero(weights != 0.0)
    changes = [
        {"t_s": times[i], "weight": float(weights[i]), "blocks": rows[i][1].get("twin_blocks")}
        for i in range(len(rows))
        if i == 0 or weights[i] != weights[i - 1]
    ]
    share = {f"{w:g}": float(np.mean(weights == w)) for w in np.unique(weights)}
    first_block = next((t for t, r in rows if r.get("twin_blocks", 0) > 0), None)
    last = rows[-1][1]
    return {
        "polls": len(rows),
        "first_off_zero_s": times[off[0]] if off.size else None,
        "first_block_judged_s": first_block,
        "share_of_polls_at_weight": share,
        "changes": changes,
        "final": last,
    }


def cpu_share(samples: list[dict[str, Any]], arm: str, wall_s: float) -> dict[str, Any]:
    """The twin's CPU as a share of one core: the arm's twin alone (``/metrics``) and the whole
    worker thread (the twin and the counterfactual comparison, ``/v1/ab``) over the run."""
    arm_cpu = [s["twins"][arm]["twin_cpu_seconds"] for s in samples
               if arm in s.get("twins", {}) and "twin_cpu_seconds" in s["twins"][arm]]  # fmt: skip
    worker = [(s["t_s"], s["worker_cpu_s"]) for s in samples if "worker_cpu_s" in s]
    out: dict[str, Any] = {"wall_s": wall_s}
    if arm_cpu:
        out["arm_twin_cpu_s"] = arm_cpu[-1]
        out["arm_twin_share"] = arm_cpu[-1] / wall_s
    if worker:
        t, c = worker[-1]
        out["worker_cpu_s"] = c
        out["worker_share"] = c / t if t > 0 else None
    return out


def loop_health(out: Path, samples: list[dict[str, Any]], ab: dict[str, Any]) -> dict[str, Any]:
    """The gateway's event loop over the run: its lag (p50, p99, max), the largest gap between
    two decision ticks, ``/metrics``' answer times and the ranks that left the rotation."""
    ticks = pd.read_parquet(out / "gateway" / "ticks.parquet", columns=["time_s"])["time_s"]
    gaps = np.diff(np.sort(ticks.to_numpy())) if len(ticks) > 1 else np.zeros(1)
    answered = np.array([s["metrics_s"] for s in samples if "metrics_s" in s])
    log = (out / "gateway.out").read_text(errors="replace")
    return {
        "loop_lag": ab.get("loop_lag"),
        "tick_gap_max_s": float(gaps.max()),
        "tick_gap_p99_s": float(np.percentile(gaps, 99)),
        "tick_gaps_over_1s": int((gaps > 1.0).sum()),
        "metrics_answer_s": {
            "median": float(np.median(answered)) if answered.size else None,
            "max": float(answered.max()) if answered.size else None,
        },
        "rank_left_rotation": log.count("left the rotation"),
        "no_rank_in_rotation": log.count("no rank is in rotation"),
    }


def offline_ab(trace: Path, model: Path, n: int, load: float, out: Path) -> dict[str, Any]:
    """``balanceroute ab`` of the live arms (and the unguarded ``gbdt``) on the same requests:
    paired windows of the twin's block length covering them."""
    arms = f"brh:none,brh:gbdt@{model},brh:gbdt@{model}{{twin=false;guard=false}}"
    windows = max(2, n // (8 * G * B))
    args = [*CLI, "ab", "--trace", str(trace), "--requests", str(n), "--arms", arms,
            "--workers", str(G), "--slots", str(B), "--load", str(load), "--windows",
            str(windows), "--window-requests", str(8 * G * B), "--reference", "brh:none",
            "--no-mlflow", "--out", str(out)]  # fmt: skip
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    s = json.loads((out / "summary.json").read_text())
    keep = ("paired", "paired_vs_reference", "ratios", "verdicts", "windows", "arms")
    return {k: s[k] for k in keep if k in s} or s


def run(args: argparse.Namespace) -> dict[str, Any]:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame, _ = load_workload(WorkloadSpec(trace=str(DATA / TRACES[args.trace])))
    train = frame.iloc[: args.train]
    rest = tiled(rebased(frame.iloc[args.train :]), args.repeat)
    n = len(rest) if args.requests is None else min(len(rest), args.requests)
    rest = rest.iloc[:n]
    replay = write_trace(rest, out / "replay.parquet")
    replay_keys = write_trace(with_live_keys(rest), out / "replay-live-keys.parquet")
    model, prior = fit_gbdt(train, out / "models", args.prior)
    arms = f"brh:none,brh:gbdt@{model}"
    gw_url = f"http://127.0.0.1:{args.gateway_port}"
    load_before = os.getloadavg()
    t0 = time.time()
    emu, urls = start_emulator(args.time_scale, args.emulator_port, out)
    try:
        extra = ["--arms", arms, "--switch-every", f"{args.window}s", "--warmup",
                 f"{args.window / 4}s", "--no-mlflow"]  # fmt: skip
        if args.twin_nice is not None:
            extra += ["--twin-nice", str(args.twin_nice)]
        if args.twin == "off":
            extra.append("--no-twins")
        gw = start_gateway(urls, args.gateway_port, extra, out, args.base_python)
        poller = Poller(gw_url, args.poll)
        try:
            poller.start()
            bench_args = [*CLI, "bench", "--trace", str(replay), "--requests", str(n), "--load",
                          str(args.load), "--time-scale", str(args.time_scale), "--slots", str(B),
                          "--ranks", str(G), "--out", str(out / "bench"), "--no-progress",
                          "--request-timeout", "900", "--url", gw_url]  # fmt: skip
            subprocess.run(bench_args, check=True, stdout=subprocess.DEVNULL,
                           timeout=args.max_wall)  # fmt: skip
            poller.stop()
            ab = httpx.get(gw_url + "/v1/ab", timeout=30, trust_env=False).json()
            wall = poller.samples[-1]["t_s"] if poller.samples else None
            processes = process_cpu(gw.proc.pid)
        finally:
            poller.stop()
            gw.terminate(120)
    finally:
        emu.terminate(60)
    load_after = os.getloadavg()
    live_wall = time.time() - t0
    bench_summary = json.loads((out / "bench" / "summary.json").read_text())
    report = out / "gateway" / "ab" / "report.md"
    gbdt = f"brh:gbdt@{model}"
    result: dict[str, Any] = {
        "trace": TRACES[args.trace],
        "G": G,
        "B": B,
        "load": args.load,
        "time_scale": args.time_scale,
        "requests": n,
        "repeat": args.repeat,
        "train_requests": args.train,
        "window_s": args.window,
        "twin": args.twin,
        "twin_nice": args.twin_nice,
        "gateway_python": args.base_python or sys.executable,
        "twin_prior": prior,
        "bench": {
            k: bench_summary.get(k)
            for k in ("completed", "failed", "median_ttft_ms", "p95_tpot_ms")
        },
        "live_wall_s": live_wall,
        "loadavg_before": load_before,
        "loadavg_after": load_after,
        "loadavg_1m_during_median": float(np.median([s["loadavg_1m"] for s in poller.samples])),
        "polls_total": len(poller.samples),
        "polls_failed": sum("error" in s for s in poller.samples),  # a first-seen time is late
        "event_loop": loop_health(out, poller.samples, ab),
        "twin_weight": weight_course(poller.samples, gbdt),
        "twin_cpu": cpu_share(poller.samples, gbdt, wall or live_wall),
        "process_cpu": processes,
        "twins": ab.get("twins"),
        "twin_feed": ab.get("twin_feed"),
        "switchback": {
            k: ab.get(k)
            for k in (
                "windows_done",
                "per_arm",
                "paired_vs_reference",
                "imbalance_ratio_vs_reference",
            )
        },
        "twin_comparison": ab.get("twin_comparison"),
        "twin_agreement": ab.get("twin_agreement"),
        "report_md": report.read_text() if report.exists() else None,
        "polls": poller.samples,
    }
    print(json.dumps({k: result[k] for k in ("twin_cpu", "event_loop", "bench")},
                     default=float), file=sys.stderr, flush=True)  # fmt: skip
    if not args.no_offline:
        t1 = time.time()
        result["offline_ab"] = offline_ab(replay_keys, model, n, args.load, out / "offline-ab")
        result["offline_ab_wall_s"] = time.time() - t1
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/live_twin")
    p.add_argument("--trace", choices=sorted(TRACES), default="azure")
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--requests", type=int, help="replayed requests (default: the rest)")
    p.add_argument("--repeat", type=int, default=1,
                   help="replay the requests after --train this many times back to back")  # fmt: skip
    p.add_argument("--load", type=float, default=1.1)
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--window", type=float, default=30.0, help="switchback window, wall s")
    p.add_argument("--poll", type=float, default=5.0, help="seconds between /metrics polls")
    p.add_argument("--prior", action="store_true", help="the model carries its twin prior")
    p.add_argument("--emulator-port", type=int, default=23100)
    p.add_argument("--gateway-port", type=int, default=23200)
    p.add_argument("--max-wall", type=float, default=1500.0, help="bench's bound, wall s")
    p.add_argument("--no-offline", action="store_true")
    p.add_argument("--twin", choices=("on", "off"), default="on",
                   help="off: the gateway runs no twins nor counterfactual (--no-twins)")  # fmt: skip
    p.add_argument("--twin-nice", type=int, help="the twins' nice (gateway's default)")
    p.add_argument("--base-python", help="run the gateway of this python's installation (a "
                   "worktree of main: before/after in one run); emulator and bench stay this "
                   "tree's")  # fmt: skip
    args = p.parse_args()
    print(json.dumps(run(args), indent=2, default=float))


if __name__ == "__main__":
    main()

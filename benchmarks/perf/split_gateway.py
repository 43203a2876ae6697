"""The gateway's data plane side by side: one process against the decider with relay workers.

For each shared trace and emulator time scale, the same requests (``--requests`` after
``--train``, at ``--load`` times the decode capacity of a G = 8, B = 32 ``paper-dsv3`` group) are
replayed by ``balanceroute bench`` through ``balanceroute gateway`` in each mode (``single``: the
one-process gateway; ``relayN``: ``--relay-workers N``), with ``count-jsq`` and ``brh``, each
against a fresh ``balanceroute emulate`` group; and once straight to the ranks (round-robin).
``pfront`` is ``single`` under its older name (the Protocol front in one process, deciding just
before the group's next step: ``--decide step``, the default); ``now`` is ``pfront`` with
``--decide now`` (each decision at once).
``--modes ...,nginx`` adds Debian's nginx as a round-robin proxy (one worker, unbuffered): what a
compiled data plane costs per token, without any admission.
Per run:

- iteration overrun: each iteration's wall interval over its cost-model duration divided by the
  time scale, minus 1, over the iterations with at least 90% of the slots running (after the
  first 2 s), median (the emulator keeps its clock when it is at most 5%);
- the steady imbalance, as ``live_gateway.py`` (iterations starting while a request waits); the
  live imbalance ratio ``brh`` / ``count-jsq`` beside the simulator's on the same requests;
- the gateway's CPU seconds (every process of it: the decider and its relay workers, told
  apart) per 1,000 relayed tokens (the emulator's generated tokens of requests that finished),
  from the first request to the last answer (start-up excluded);
- the added median TTFT at low load (``--ttft-requests`` at ``--ttft-load``, real time): the
  client's TTFT minus the engine's own first-chunk time, through the gateway minus straight to
  the ranks (``live_gateway.py``'s measure).

``--pool DIR,DIR,...`` pools repeated runs of one mode (``--modes``, ``--traces``, one
``--time-scales``) made with the same ``--requests`` and ``--train``: BR-H's live ratio as the
mean of its steady imbalance over every run against ``count-jsq``'s, each run resampled in
blocks within itself, beside the simulator's and each run's own; ``--sim-draws N`` also pools the
simulator over N replays of the same requests with each send up to ``--sim-jitter-ms`` late (one
replay of a saturated group is one draw of a chaotic trajectory) and gives the live ratio over
that ensemble's, with an interval over both resamplings; ``--saturated 0.95`` keeps only the live
steady iterations with 95% of the slots running (with the step timing a held request waits while slots
are free, which the simulator's steady iterations never have). The ``*_runs_ci95`` intervals
resample whole runs instead (the spread between repeats, which blocks within each run miss),
and ``steady_imbalance_over_sim_ensemble`` gives each router's own live imbalance over the
ensemble's.

``--profile DIR`` instead runs the one-process gateway under cProfile with ``brh`` and writes the
top functions by own time (a relay worker process is not profiled).

    .venv/bin/python benchmarks/perf/split_gateway.py --out runs/split > runs/split.json
    .venv/bin/python benchmarks/perf/split_gateway.py --profile runs/split_prof --traces azure
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import psutil

from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.router.lab.cost import cost_preset
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port

sys.path.insert(0, str(Path(__file__).resolve().parent))
from live_gateway import (
    CLI,
    COST,
    DATA,
    TRACES,
    B,
    G,
    _outside_the_engine_ms,
    bench,
    gateway_view,
    live_figures,
    rebased,
    released,
    sim_arm,
    start_emulator,
    steady_series,
    stop,
)
from side_by_side_intervals import median_gap

ROUTERS = ("count-jsq", "brh:none")
VIEW_KEYS = ("tick_gap_", "view_error_", "forward_lag_", "finish_heard_lag_")  # gateway_view()
# uvicorn re-raises SIGTERM after its shutdown: a handler of ours turns it into SystemExit, which
# cProfile.run catches before writing the profile
PROFILED = (
    "import signal, sys, cProfile; from balanceroute.cli import main; "
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0)); cProfile.run('main()', {out!r})"
)


def mode_args(mode: str) -> list[str]:
    """The gateway flags of a mode: ``single`` or ``pfront`` (the default: the Protocol front
    in one process, deciding just before the group's next step), ``now`` (``--decide now``) or
    ``relayN`` (``nginx``: no gateway)."""
    if mode in ("single", "pfront", "nginx"):
        return []
    if mode == "now":
        return ["--decide", "now"]
    if mode.startswith("relay") and mode[5:].isdigit():
        return ["--relay-workers", mode[5:]]
    raise SystemExit(f"unknown mode {mode!r}: single, pfront, now or relayN")


def start_gateway(urls: list[str], extra: list[str], out_dir: Path,
                  profile: Path | None = None) -> tuple[ServerProcess, str]:  # fmt: skip
    port = free_port()
    head = CLI if profile is None else [sys.executable, "-c", PROFILED.format(out=str(profile))]
    args = [*head, "gateway", "--slots", str(B), "--port", str(port), "--out", str(out_dir),
            "--no-mlflow"]  # fmt: skip
    for u in urls:
        args += ["--rank", u]
    env = clean_env({"BALANCEROUTE_LOG_LEVEL": "warning"})
    out_dir.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess(args + extra, log=out_dir.parent / "gateway.out", env=env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready([url + "/readyz"], timeout_s=180, poll_s=0.2)
    return proc, url


NGINX_CONF = """worker_processes 1;
user root;
pid {dir}/nginx.pid;
error_log {dir}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {dir}/body;
  proxy_temp_path {dir}/proxy;
  upstream ranks {{ {servers} keepalive 512; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://ranks;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_buffering off;
      proxy_request_buffering off;
      proxy_read_timeout 3600s;
    }}
  }}
}}
"""


def start_nginx(urls: list[str], out_dir: Path) -> tuple[ServerProcess, str]:
    """nginx (Debian's) in front of the ranks, round-robin, one worker, unbuffered streams."""
    out_dir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    servers = " ".join(f"server {u.split('://', 1)[1]};" for u in urls)
    conf = out_dir / "nginx.conf"
    conf.write_text(NGINX_CONF.format(dir=out_dir.resolve(), servers=servers, port=port))
    proc = ServerProcess(["nginx", "-p", str(out_dir.resolve()), "-c", str(conf.resolve()), "-g",
                          "daemon off;"], log=out_dir / "nginx.out")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready([url + "/health"], timeout_s=60, poll_s=0.2)
    return proc, url


def cpu_split(pid: int) -> dict[str, float]:
    """CPU seconds (user + system) of the gateway process and of its children."""
    main = psutil.Process(pid)
    t = main.cpu_times()
    kids = 0.0
    for child in main.children(recursive=True):
        try:
            c = child.cpu_times()
            kids += c.user + c.system
        except psutil.NoSuchProcess:
            continue
    return {"main": t.user + t.system, "children": kids}


def overrun(emu_dir: Path, ts: float) -> dict[str, Any]:
    """Median (and p90) iteration overrun over the nearly full iterations."""
    it, _ = read_log(emu_dir)
    running = rank_matrix(it, "running").sum(axis=1)
    end = it["end_s"].to_numpy()
    nominal = it["duration_s"].to_numpy() / ts
    ratio = np.diff(end) / nominal[1:] - 1
    full = (running[1:] >= 0.9 * G * B) & (end[1:] >= end[0] + 2.0)
    if not full.any():
        return {"overrun_p50": None, "overrun_p90": None, "full_iterations": 0}
    return {
        "overrun_p50": float(np.median(ratio[full])),
        "overrun_p90": float(np.percentile(ratio[full], 90)),
        "full_iterations": int(full.sum()),
    }


def engine_view(run_dir: Path, ts: float) -> dict[str, Any]:
    """How full the engine ran and how well it kept its clock over every iteration with a
    request running (after the first 2 s): the overrun, the median lateness behind its schedule
    (ms, and as a share of the median iteration) and the re-anchorings; how long the replay
    took."""
    it, _ = read_log(run_dir / "emulator")
    running = rank_matrix(it, "running").sum(axis=1)
    end = it["end_s"].to_numpy()
    ratio = np.diff(end) / (it["duration_s"].to_numpy()[1:] / ts) - 1
    busy = (running[1:] > 0) & (end[1:] >= end[0] + 2.0)
    summary = json.loads((run_dir / "bench" / "summary.json").read_text())
    late = (end - it["deadline_s"].to_numpy())[1:][busy]
    nominal = float(np.median(it["duration_s"].to_numpy()[1:][busy] / ts)) if busy.any() else None
    emu = json.loads((run_dir / "emulator" / "summary.json").read_text())
    return {
        "running_p50": float(np.median(running[running > 0])) if (running > 0).any() else 0.0,
        "overrun_busy_p50": float(np.median(ratio[busy])) if busy.any() else None,
        "lateness_p50_ms": float(np.median(late)) * 1e3 if busy.any() else None,
        "lateness_share": float(np.median(late)) / nominal if nominal else None,
        "resyncs": emu["resyncs"],
        "bench_duration_s": summary["duration"],
        "median_ttft_ms": summary["median_ttft_ms"],
    }


def reanalyze(old: dict[str, Any], out: Path, load: float) -> dict[str, Any]:
    """A saved run with :func:`engine_view` and the gateway's view added to every run, and
    BR-H's ratios with their intervals, from ``out``'s logs."""
    for key, runs in old["runs"].items():
        name, scale = key.split("/")
        ts = float(scale[1:])
        replay = pd.read_parquet(out / name / "replay.parquet")
        rel, _ = released(replay, load)
        series = {r: sim_series(rel, r) for r in ROUTERS}
        for label, row in runs.items():
            if "imbalance_ratio" in label:
                continue
            mode, _, router = label.partition("/")
            suffix = mode if not router else f"{mode}-{router.replace(':', '-')}"
            run_dir = out / name / f"{scale}-{suffix}"
            row.update(engine_view(run_dir, ts))
            if (run_dir / "gateway" / "ticks.parquet").exists():
                it, rq = read_log(run_dir / "emulator")
                row.update(gateway_view(run_dir, it, rq))
        for mode in {k.split("/")[0] for k in runs if "/" in k and "imbalance" not in k}:
            if all(f"{mode}/{r}" in runs for r in ROUTERS):
                runs[f"{mode}/brh_imbalance_ratio"] = brh_ratio(mode, out / name, scale, series)
    old["reanalyzed"] = True
    return old


def relayed_tokens(emu_dir: Path) -> int:
    _, rq = read_log(emu_dir)
    return int(rq.loc[rq["finish_reason"] != "abort", "generated"].sum())


def one_run(urls_mode: str | None, router: str | None, trace: Path, n: int, ts: float,
            load: float, out: Path) -> dict[str, Any]:  # fmt: skip
    """One replay: through the gateway in ``urls_mode`` with ``router``, or direct (None)."""
    out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(ts, out / "emulator", out / "emulator.out")
    cpu = None
    try:
        if urls_mode is None:
            summary = bench(urls, trace, n, load, ts, out / "bench")
        else:
            if urls_mode == "nginx":
                gw, gw_url = start_nginx(urls, out / "nginx")
            else:
                extra = ["--router", router, *mode_args(urls_mode)]
                gw, gw_url = start_gateway(urls, extra, out / "gateway")
            try:
                before = cpu_split(gw.pid)
                summary = bench([gw_url], trace, n, load, ts, out / "bench")
                after = cpu_split(gw.pid)
                cpu = {k: after[k] - before[k] for k in after}
            finally:
                stop(gw)
    finally:
        stop(emu)
    tokens = relayed_tokens(out / "emulator")
    figs = live_figures(out, summary, ts, None, n)
    row = {
        **engine_view(out, ts),
        "completed": summary["completed"],
        "failed": summary["failed"],
        "steady_imbalance": figs["steady_imbalance"],
        "steady_iterations": figs["steady_iterations"],
        "idle_slots_while_waiting_p50": figs["idle_slots_while_waiting_p50"],
        **{k: v for k, v in figs.items() if k.startswith(VIEW_KEYS)},
        "relayed_tokens": tokens,
        **overrun(out / "emulator", ts),
    }
    if cpu is not None:
        total = cpu["main"] + cpu["children"]
        row.update(
            cpu_s=total,
            cpu_s_decider=cpu["main"] if urls_mode.startswith("relay") else None,
            cpu_s_relays=cpu["children"] if urls_mode.startswith("relay") else None,
            cpu_s_per_1k_tokens=1e3 * total / tokens if tokens else None,
        )
    return row


def added_ttft(trace: Path, modes: list[str], n: int, load: float, out: Path) -> dict[str, Any]:
    """Low-load TTFT outside the engine: direct, then through the gateway in each mode."""
    res: dict[str, Any] = {"requests": n, "load": load}
    out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(1.0, out / "emu-direct", out / "emu-direct.out")
    try:
        bench(urls, trace, n, load, 1.0, out / "direct")
    finally:
        stop(emu)
    direct = float(np.median(_outside_the_engine_ms(out / "direct", out / "emu-direct")))
    res["direct_outside_engine_ms_p50"] = direct
    for mode in modes:
        emu, urls = start_emulator(1.0, out / f"emu-{mode}", out / f"emu-{mode}.out")
        try:
            if mode == "nginx":
                gw, gw_url = start_nginx(urls, out / "nginx")
            else:
                extra = ["--router", "count-jsq", *mode_args(mode)]
                gw, gw_url = start_gateway(urls, extra, out / f"gw-{mode}")
            try:
                bench([gw_url], trace, n, load, 1.0, out / mode)
            finally:
                stop(gw)
        finally:
            stop(emu)
        via = _outside_the_engine_ms(out / mode, out / f"emu-{mode}")
        res[mode] = {
            "outside_engine_ms_p50": float(np.median(via)),
            "added_median_ttft_ms": float(np.median(via)) - direct,
        }
    return res


def profile(trace: Path, n: int, ts: float, load: float, mode: str, out: Path) -> dict[str, Any]:
    """The gateway under cProfile for one ``brh`` replay: the top functions by own time."""
    out.mkdir(parents=True, exist_ok=True)
    prof = out / "gateway.prof"
    emu, urls = start_emulator(ts, out / "emulator", out / "emulator.out")
    try:
        extra = ["--router", "brh:none", *mode_args(mode)]
        gw, gw_url = start_gateway(urls, extra, out / "gateway", profile=prof)
        try:
            summary = bench([gw_url], trace, n, load, ts, out / "bench")
        finally:
            stop(gw)
    finally:
        stop(emu)
    files = [p for p in [prof] if p.exists()]
    stats = pstats.Stats(*map(str, files))
    total = stats.total_tt  # type: ignore[attr-defined]
    rows = []
    for (file, line, func), (_, calls, own, cum, _) in stats.stats.items():  # type: ignore[attr-defined]
        rows.append((own, cum, calls, f"{Path(file).name}:{line}({func})"))
    rows.sort(reverse=True)
    tokens = relayed_tokens(out / "emulator")
    return {
        "time_scale": ts,
        "mode": mode,
        "completed": summary["completed"],
        "relayed_tokens": tokens,
        "profiled_s": total,
        "profiled_s_per_1k_tokens": 1e3 * total / tokens if tokens else None,
        "top_own": [
            {"fn": name, "own_s": round(own, 3), "share": round(own / total, 4), "calls": calls}
            for own, cum, calls, name in rows[:25]
        ],
    }


def _f(value: Any, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def _ci(ci: list[float] | None) -> str:
    return "" if not ci else f"[{ci[0]:.3f}, {ci[1]:.3f}]"


def _pair(row: dict[str, Any], key: str, fmt: str) -> str:
    return f"{_f(row.get(key + '_p50'), fmt)} / {_f(row.get(key + '_p90'), fmt)}"


def render(result: dict[str, Any]) -> str:
    """The tables of ``docs/results.md`` from a saved (reanalyzed) result."""
    lines = []
    for key, runs in result["runs"].items():
        lines += [
            f"**{key}**:",
            "",
            "| run | replay (s) | engine running p50 | overrun p50 (full) | lateness p50 (share of "
            "an iteration), re-anchorings | steady imbalance | idle slots while waiting p50 | CPU s "
            "per 1k tokens (decider + relays) |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for label, row in runs.items():
            if "imbalance_ratio" in label:
                continue
            cpu = _f(row.get("cpu_s_per_1k_tokens"))
            if row.get("cpu_s_decider") is not None:
                tokens = row["relayed_tokens"] / 1e3
                cpu += (f" ({row['cpu_s_decider'] / tokens:.3f} + "
                        f"{row['cpu_s_relays'] / tokens:.3f})")  # fmt: skip
            lines.append(
                f"| {label} | {_f(row.get('bench_duration_s'), '.1f')} | "
                f"{_f(row.get('running_p50'), '.0f')} | {_f(row.get('overrun_p50'), '.1%')} | "
                f"{_f(row.get('lateness_p50_ms'), '.1f')} ms ({_f(row.get('lateness_share'), '.0%')}),"
                f" {row.get('resyncs', 'n/a')} | {_f(row.get('steady_imbalance'), ',.0f')} | "
                f"{_f(row.get('idle_slots_while_waiting_p50'), '.0f')} | {cpu} |"
            )
        lines += ["", "| run | steady iterations | view error p50 / p90 | admission to the rank p50 / p90 "
                  "(ms) | last token to the gateway p50 / p90 (ms) | tick gap while waiting p50 / p90 "
                  "(ms) |", "|---|---|---|---|---|---|"]  # fmt: skip
        for label, row in runs.items():
            if "imbalance_ratio" in label or label == "direct" or label == "nginx":
                continue
            lines.append(
                f"| {label} | {row.get('steady_iterations', 'n/a')} | "
                f"{_pair(row, 'view_error', '.1%')} | {_pair(row, 'forward_lag_ms', '.1f')} | "
                f"{_pair(row, 'finish_heard_lag_ms', '.1f')} | "
                f"{_pair(row, 'tick_gap_waiting_ms', '.1f')} |"
            )
        ratios = [f"{k.split('/')[0]} {_f(v['live'])} {_ci(v.get('live_ci95'))} (sim "
                  f"{_f(v['sim'])} {_ci(v.get('sim_ci95'))}; live/sim {_f(v.get('live_over_sim'), '.2f')})"
                  for k, v in runs.items() if "imbalance_ratio" in k]  # fmt: skip
        if ratios:
            lines += ["", "BR-H's steady imbalance over `count-jsq`'s, live: " + "; ".join(ratios)]
        lines.append("")
    tt = result.get("added_ttft")
    if tt:
        parts = [f"{m} +{_f(v['added_median_ttft_ms'], '.2f')} ms" for m, v in tt.items()
                 if isinstance(v, dict)]  # fmt: skip
        lines.append(f"Added median TTFT at low load ({tt['requests']} requests at {tt['load']:g}x "
                     f"capacity, real time; direct {_f(tt['direct_outside_engine_ms_p50'], '.2f')} "
                     f"ms outside the engine): " + ", ".join(parts))  # fmt: skip
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/split")
    p.add_argument("--traces", default="azure,mooncake")
    p.add_argument("--time-scales", default="1,4,16")
    p.add_argument("--modes", default="single,relay1,relay2")
    p.add_argument("--routers", default=",".join(ROUTERS))
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--load", type=float, default=1.1)
    p.add_argument("--ttft-requests", type=int, default=150)
    p.add_argument("--ttft-load", type=float, default=0.2)
    p.add_argument("--no-ttft", action="store_true")
    p.add_argument("--no-direct", action="store_true",
                   help="skip bench straight to the ranks (a repeat for --pool, which reads "
                   "only the gateway's runs)")  # fmt: skip
    p.add_argument("--profile", metavar="DIR", help="profile the gateway (brh) instead")
    p.add_argument("--reanalyze", metavar="JSON", help="add the engine's view to a saved run")
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved result")
    p.add_argument("--pool", metavar="DIRS", help="pool repeated runs' BR-H ratios (--out of each)")
    p.add_argument("--sim-draws", type=int, default=0, metavar="N",
                   help="with --pool: also the simulator pooled over N replays with send jitter")  # fmt: skip
    p.add_argument("--sim-jitter-ms", type=float, default=5.0,
                   help="with --sim-draws: each send up to this many real ms late (uniform)")  # fmt: skip
    p.add_argument("--saturated", type=float, default=0.0, metavar="SHARE",
                   help="with --pool: live steady iterations only with this share of the slots running")  # fmt: skip
    p.add_argument("--compare", metavar="A,B",
                   help="paired TTFT and throughput of mode B against mode A in --out (no run)")  # fmt: skip
    args = p.parse_args()
    if args.compare:
        print(json.dumps(compare_modes(args), indent=2, default=float))
        return
    if args.pool:
        print(json.dumps(pool_runs(args), indent=2, default=float))
        return
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    if args.reanalyze:
        old = json.loads(Path(args.reanalyze).read_text())
        print(json.dumps(reanalyze(old, Path(args.out), args.load), indent=2, default=float))
        return
    out = Path(args.profile or args.out)
    names = [t for t in args.traces.split(",") if t]
    scales = [float(s) for s in args.time_scales.split(",") if s]
    modes = [m for m in args.modes.split(",") if m]
    routers = [r for r in args.routers.split(",") if r]
    result: dict[str, Any] = {"G": G, "B": B, "load": args.load, "requests": args.requests,
                              "loadavg_before": os.getloadavg(), "runs": {}}  # fmt: skip
    t0 = time.time()
    for name in names:
        frame, _ = load_workload(WorkloadSpec(trace=str(DATA / TRACES[name])))
        replay = rebased(frame.iloc[args.train : args.train + args.requests])
        folder = out / name
        folder.mkdir(parents=True, exist_ok=True)
        trace = write_trace(replay, folder / "replay.parquet")
        if args.profile:
            for ts in scales:
                for mode in modes:
                    key = f"{name}/x{ts:g}/{mode}"
                    result["runs"][key] = profile(trace, args.requests, ts, args.load, mode,
                                                  folder / f"x{ts:g}-{mode}")  # fmt: skip
                    print(key, json.dumps(result["runs"][key])[:400], file=sys.stderr, flush=True)
            continue
        rel, _ = released(replay, args.load)
        sim = {r: sim_arm(rel, r, None)["steady_imbalance"] for r in routers}
        result.setdefault("sim_steady_imbalance", {})[name] = sim
        series = {r: sim_series(rel, r) for r in ROUTERS if r in routers}
        for ts in scales:
            runs: dict[str, Any] = {}
            if not args.no_direct:
                runs["direct"] = one_run(None, None, trace, args.requests, ts, args.load,
                                         folder / f"x{ts:g}-direct")  # fmt: skip
            for mode in modes:
                if mode == "nginx":  # round-robin, no router: one run
                    runs["nginx"] = one_run(mode, None, trace, args.requests, ts, args.load,
                                            folder / f"x{ts:g}-nginx")  # fmt: skip
                    print(name, ts, "nginx", json.dumps(runs["nginx"]), file=sys.stderr, flush=True)
                    continue
                for r in routers:
                    runs[f"{mode}/{r}"] = one_run(mode, r, trace, args.requests, ts, args.load,
                                                  folder / f"x{ts:g}-{mode}-{r.replace(':', '-')}")  # fmt: skip
                    print(name, ts, mode, r, json.dumps(runs[f"{mode}/{r}"]), file=sys.stderr,
                          flush=True)  # fmt: skip
                if "count-jsq" in routers and "brh:none" in routers:
                    runs[f"{mode}/brh_imbalance_ratio"] = brh_ratio(
                        mode, folder, f"x{ts:g}", series
                    )
            result["runs"][f"{name}/x{ts:g}"] = runs
    if not args.profile and not args.no_ttft:
        first = out / names[0] / "replay.parquet"
        frame = pd.read_parquet(first)
        ttft_trace = write_trace(frame.iloc[: args.ttft_requests], out / "ttft-replay.parquet")
        result["added_ttft"] = added_ttft(ttft_trace, modes, args.ttft_requests, args.ttft_load,
                                          out / "ttft")  # fmt: skip
    result["wall_s"] = time.time() - t0
    result["loadavg_after"] = os.getloadavg()
    print(json.dumps(result, indent=2, default=float))


BLOCK = 64  # iterations per bootstrap block: longer than a request's typical stay's effect
RESAMPLES = 2000
RUN_RESAMPLES = 20_000  # draws of whole runs (--pool's ``*_runs_ci95``: the repeats' spread)


def ratio_interval(a: np.ndarray, b: np.ndarray, seed: int = 0) -> list[float] | None:
    """A 95% moving-block bootstrap interval of ``mean(a) / mean(b)`` (two runs' steady
    imbalance series, each resampled in blocks of :data:`BLOCK` consecutive steady iterations:
    neighbouring iterations are far from independent)."""
    if a.size < BLOCK or b.size < BLOCK:
        return None
    return pooled_interval([a], [b], seed)


def sim_series(rel: ReleasedRequests, spec: str) -> np.ndarray:
    """The simulator's steady imbalance series (pool non-empty after admission) of ``spec``
    without an estimator (as ``sim_arm``)."""
    rs = RouterSpec.parse(spec)
    result = simulate(rel, rs.build_policy(None), SimConfig(G, B, cost_preset(COST)))
    loads = result.loads
    imb = loads.shape[1] * loads.max(axis=1) - loads.sum(axis=1)
    return imb[result.waiting > 0]


def brh_ratio(mode: str, folder: Path, scale: str, sim: dict[str, np.ndarray]) -> dict[str, Any]:
    """BR-H's steady imbalance over ``count-jsq``'s in ``mode``, live and simulated, each with
    its 95% block-bootstrap interval, and the live ratio over the simulator's."""
    live = {r: steady_series(folder / f"{scale}-{mode}-{r.replace(':', '-')}") for r in ROUTERS}
    lr = _ratio(float(live["brh:none"].mean()) if live["brh:none"].size else None,
                float(live["count-jsq"].mean()) if live["count-jsq"].size else None)  # fmt: skip
    sr = _ratio(float(sim["brh:none"].mean()), float(sim["count-jsq"].mean()))
    return {
        "live": lr,
        "live_ci95": ratio_interval(live["brh:none"], live["count-jsq"]),
        "sim": sr,
        "sim_ci95": ratio_interval(sim["brh:none"], sim["count-jsq"]),
        "live_over_sim": _ratio(lr, sr),
        "steady_iterations_live": {r: int(v.size) for r, v in live.items()},
    }


def pooled_resamples(a: list[np.ndarray], b: list[np.ndarray], seed: int = 0) -> np.ndarray:
    """:data:`RESAMPLES` bootstrap draws of ``sum(mean(a_i)) / sum(mean(b_i))`` over repeated
    runs ``i``, each run's series resampled in blocks of :data:`BLOCK` within itself (the runs
    are the repeats, each weighs the same)."""
    rng = np.random.default_rng(seed)

    def means(x: np.ndarray) -> np.ndarray:
        blocks = np.lib.stride_tricks.sliding_window_view(x, BLOCK).mean(axis=1)
        return blocks[rng.integers(0, blocks.size, (RESAMPLES, max(1, x.size // BLOCK)))].mean(1)

    top = sum(means(x) for x in a)
    bottom = sum(means(x) for x in b)
    return top / np.maximum(bottom, 1e-9)


def pooled_interval(a: list[np.ndarray], b: list[np.ndarray], seed: int = 0) -> list[float]:
    """The 95% interval of :func:`pooled_resamples`."""
    return _ci95(pooled_resamples(a, b, seed))


def _ci95(r: np.ndarray) -> list[float]:
    return [float(np.percentile(r, 2.5)), float(np.percentile(r, 97.5))]


def send_jittered(rel: ReleasedRequests, jitter_s: float, seed: int) -> ReleasedRequests:
    """The same requests, each released up to ``jitter_s`` model seconds later (uniform; the
    order kept): a client whose sends run a few milliseconds late."""
    rng = np.random.default_rng(seed)
    late = rel.release_s + rng.uniform(0.0, jitter_s, rel.size)
    return replace(rel, release_s=np.maximum.accumulate(late))


def sim_ensemble(rel: ReleasedRequests, draws: int, jitter_s: float) -> dict[str, Any]:
    """The simulator's BR-H ratio over ``draws`` replays of the same requests with send jitter
    (:func:`send_jittered`, seeds 0..draws-1): one replay of a saturated group is one draw of a
    chaotic trajectory, so the reference a pooled live ratio compares with is pooled the same
    way (the sum of the draws' steady means, BR-H over ``count-jsq``), with the draws' resamples
    (:data:`RESAMPLES`, the draws resampled whole, the two routers of a draw together)."""
    means = np.array(
        [[float(sim_series(send_jittered(rel, jitter_s, d), r).mean()) for r in ROUTERS]
         for d in range(draws)]
    )  # fmt: skip
    pick = np.random.default_rng(1).integers(0, draws, (RESAMPLES, draws))
    boot = means[pick, 1].sum(1) / means[pick, 0].sum(1)
    print(f"simulator ensemble: {draws} draws done", file=sys.stderr, flush=True)
    return {
        "ratio": float(means[:, 1].sum() / means[:, 0].sum()),
        "ci95": _ci95(boot),
        "resamples": boot,
        "steady_mean": {r: float(means[:, i].mean()) for i, r in enumerate(ROUTERS)},
        "per_draw_ratio_p10_p50_p90": np.percentile(
            means[:, 1] / means[:, 0], [10, 50, 90]
        ).tolist(),
    }


def pool_runs(args: argparse.Namespace) -> dict[str, Any]:
    """BR-H's live ratio pooled over the repeated runs in ``--pool`` (module docstring)."""
    folders = [Path(d) for d in args.pool.split(",") if d]
    name = args.traces.split(",")[0]
    mode = args.modes.split(",")[0]
    scale = f"x{float(args.time_scales.split(',')[0]):g}"
    replays = [f / name / "replay.parquet" for f in folders]
    missing = [str(r) for r in replays if not r.is_file()]
    if missing:
        raise SystemExit(f"--pool: no replay in {', '.join(missing)} (is --traces right?)")
    if len({r.read_bytes() for r in replays}) > 1:
        raise SystemExit("--pool: the runs replayed different requests (--requests, --train)")
    live: dict[str, list[np.ndarray]] = {r: [] for r in ROUTERS}
    clients: list[dict[str, Any]] = []  # what each run's client saw, per router
    for f in folders:
        seen: dict[str, Any] = {}
        for r in ROUTERS:
            run = f / name / f"{scale}-{mode}-{r.replace(':', '-')}"
            summary = json.loads((run / "bench" / "summary.json").read_text())
            seen[r] = {k: summary[k] for k in ("duration", "output_throughput", "median_ttft_ms",
                                                "p95_ttft_ms", "p99_ttft_ms", "failed")}  # fmt: skip
            series = steady_series(run, args.saturated)
            if series.size < BLOCK:
                raise SystemExit(f"--pool: {run} has {series.size} steady iterations (< {BLOCK})")
            live[r].append(series)
        clients.append(seen)
    rel, _ = released(pd.read_parquet(replays[0]), args.load)
    sim = {r: sim_series(rel, r) for r in ROUTERS}
    sr = float(sim["brh:none"].mean() / sim["count-jsq"].mean())
    lr = sum(float(x.mean()) for x in live["brh:none"]) / sum(
        float(x.mean()) for x in live["count-jsq"]
    )
    boot = pooled_resamples(live["brh:none"], live["count-jsq"])
    ci = _ci95(boot)
    means = {r: np.array([float(x.mean()) for x in v]) for r, v in live.items()}
    pick = np.random.default_rng(0).integers(0, len(folders), (RUN_RESAMPLES, len(folders)))
    by_runs = means["brh:none"][pick].sum(1) / means["count-jsq"][pick].sum(1)
    ensemble: dict[str, Any] = {}
    if args.sim_draws:
        jitter_s = args.sim_jitter_ms / 1e3 * float(args.time_scales.split(",")[0])
        ens = sim_ensemble(rel, args.sim_draws, jitter_s)
        rest = ens.pop("resamples")
        own = {
            r: {"over_sim_ensemble": float(m.mean()) / ens["steady_mean"][r],
                "runs_ci95": _ci95(m[pick].mean(1) / ens["steady_mean"][r])}
            for r, m in means.items()
        }  # fmt: skip
        ensemble = {
            "sim_ensemble": {"draws": args.sim_draws, "jitter_ms": args.sim_jitter_ms, **ens},
            "live_over_sim_ensemble": lr / ens["ratio"],
            "live_over_sim_ensemble_ci95": _ci95(boot / rest),
            "live_over_sim_ensemble_runs_ci95": _ci95(by_runs / ens["ratio"]),
            "steady_imbalance_over_sim_ensemble": own,
        }
    return {
        "trace": name, "mode": mode, "scale": scale, "runs": [str(f) for f in folders],
        "per_run": [
            {"brh:none": float(a.mean()), "count-jsq": float(b.mean()),
             "live": float(a.mean() / b.mean()), "live_over_sim": float(a.mean() / b.mean()) / sr,
             "client": c}
            for a, b, c in zip(live["brh:none"], live["count-jsq"], clients, strict=True)
        ],
        "sim": sr, "sim_ci95": ratio_interval(sim["brh:none"], sim["count-jsq"]),
        "live": lr, "live_ci95": ci,
        "live_over_sim": lr / sr, "live_over_sim_ci95": [c / sr for c in ci],
        "live_over_sim_runs_ci95": [c / sr for c in _ci95(by_runs)],
        **ensemble,
    }  # fmt: skip


def compare_modes(args: argparse.Namespace) -> dict[str, Any]:
    """Mode B against mode A (``--compare A,B``) in one ``--out``, per router: each request's
    client TTFT paired over the two runs (the same requests), median of B minus median of A with
    a paired 95% bootstrap, the share of requests B made later, and each run's throughput."""
    a_mode, b_mode = args.compare.split(",")
    name = args.traces.split(",")[0]
    scale = f"x{float(args.time_scales.split(',')[0]):g}"
    rng = np.random.default_rng(0)
    out: dict[str, Any] = {"trace": name, "scale": scale, "a": a_mode, "b": b_mode}
    for r in ROUTERS:
        runs = [
            Path(args.out) / name / f"{scale}-{m}-{r.replace(':', '-')}" for m in (a_mode, b_mode)
        ]
        missing = [str(x) for x in runs if not (x / "bench" / "requests.parquet").is_file()]
        if missing:
            raise SystemExit(f"--compare: no bench requests in {', '.join(missing)}")
        ttft = [pd.read_parquet(x / "bench" / "requests.parquet").set_index("request_id")["ttft_s"] * 1e3
                for x in runs]  # fmt: skip
        both = pd.concat(ttft, axis=1, join="inner").dropna().to_numpy()
        summaries = [json.loads((x / "bench" / "summary.json").read_text()) for x in runs]
        out[r] = {
            "ttft_p50_ms": [float(np.median(both[:, 0])), float(np.median(both[:, 1]))],
            "ttft_p90_ms": np.percentile(both, 90, axis=0).tolist(),
            "b_minus_a_p50": median_gap(pd.Series(both[:, 1]), pd.Series(both[:, 0]), 4000, rng),
            "b_later_share": float((both[:, 1] > both[:, 0]).mean()),
            "output_throughput": [s["output_throughput"] for s in summaries],
            "failed": [s["failed"] for s in summaries],
        }
    return out


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


if __name__ == "__main__":
    main()

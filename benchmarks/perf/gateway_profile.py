"""Where the gateway's CPU goes on its requests' path, as JSON: ``balanceroute gateway`` (the
default layout, the Protocol front in one process; ``--layout proto1`` for a relay worker) in front of an emulated group
(G = 8, B = 32, real time) with ``balanceroute bench`` replaying the shared Azure trace, the
gateway's CPU seconds per 1,000 relayed tokens and, with ``--profile``, its main thread under
cProfile over the bench run only (the top functions by own time and by cumulative time, with
their call counts).

``--perf``: the gateway's process sampled by ``perf record -e cpu-clock`` over the bench run
(kernel, uvloop, httptools, numpy and the interpreter apart; ``perf report -i OUT/perf.data``),
summarised as the share of samples per shared object.

cProfile slows every Python call, so the CPU figure of a profiled run is not the gateway's:
run once without ``--profile`` for the cost, once with it for the split. Call counts are exact
and repeat from run to run; divide them by the tokens relayed for the calls per token.

    .venv/bin/python benchmarks/perf/gateway_profile.py --requests 150 --load 0.2 > runs/cost.json
    .venv/bin/python benchmarks/perf/gateway_profile.py --profile --out runs/profile > runs/profile.json
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
from side_by_side import cpu_s  # this script's folder is on the path

from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.serving.testbed.emulator.config import DEFAULT_MODEL
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port, free_ports

REPO = Path(__file__).resolve().parents[2]
TRACE = REPO.parent / "shared" / "data" / "azure_llm_2023_conv.csv"
G, B = 8, 32
LAYOUTS = {"protocol": [], "proto1": ["--relay-workers", "1"]}
MAIN = "import sys; from balanceroute.cli import main; sys.exit(main())"
# the profiler runs from SIGUSR1 (the bench starts) to SIGUSR2 (it ended), when it is written
PROFILED = """
import cProfile, signal, sys
from balanceroute.cli import main
prof = cProfile.Profile()
signal.signal(signal.SIGUSR1, lambda *_: prof.enable())
def stop(*_):
    prof.disable()
    prof.dump_stats({out!r})
signal.signal(signal.SIGUSR2, stop)
sys.exit(main())
"""


def top(stats_file: Path, tokens: int, n: int) -> dict[str, list[dict[str, Any]]]:
    """The ``n`` functions with the most own time and the most cumulative time."""
    st = pstats.Stats(str(stats_file))
    rows = []
    for (file, line, name), (_, nc, tt, ct, _) in st.stats.items():  # type: ignore[attr-defined]
        where = f"{file.split('site-packages/')[-1].split('balanceroute/')[-1]}:{line}({name})"
        rows.append({"function": where, "calls": nc, "calls_per_token": nc / max(tokens, 1),
                     "own_s": tt, "cum_s": ct})  # fmt: skip
    own = sorted(rows, key=lambda r: -r["own_s"])[:n]
    cum = sorted(rows, key=lambda r: -r["cum_s"])[:n]
    return {"by_own_time": own, "by_cumulative_time": cum}


def perf_objects(data: Path) -> dict[str, float]:
    """Share of the perf samples per shared object (the kernel's included)."""
    report = subprocess.run(["perf", "report", "-i", str(data), "--stdio", "--no-children",
                             "--sort", "dso", "-g", "none"], capture_output=True, text=True)  # fmt: skip
    shares: dict[str, float] = {}
    for line in report.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0].endswith("%"):
            shares[parts[1]] = float(parts[0].rstrip("%"))
    return shares


def cpu_parts(proc: psutil.Process) -> dict[str, float]:
    """CPU seconds of the gateway's event-loop thread (user, system), its other threads and its
    child processes: where a cost that is not the loop's comes from."""
    loop_user = loop_system = others = 0.0
    for t in proc.threads():
        if t.id == proc.pid:
            loop_user, loop_system = t.user_time, t.system_time
        else:
            others += t.user_time + t.system_time
    children = sum(sum(cpu_s(c, children=False)) for c in proc.children(recursive=True))
    return {"loop_user": loop_user, "loop_system": loop_system, "other_threads": others,
            "children": children}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default="runs/gateway_profile")
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--load", type=float, default=0.2, help="a fraction of the group's capacity")
    p.add_argument("--skip", type=int, default=3000, help="trace rows skipped before the replay")
    p.add_argument("--router", default="count-jsq")
    p.add_argument("--layout", choices=sorted(LAYOUTS), default="protocol")
    p.add_argument(
        "--profile", action="store_true", help="the gateway's main thread under cProfile"
    )
    p.add_argument(
        "--plain",
        action="store_true",
        help="the gateway started as a user would: only "
        "the required flags (MLflow on, in the run folder; info log)",
    )
    p.add_argument("--gateway-args", default="", help="more gateway flags, as one string")
    p.add_argument("--perf", action="store_true", help="sample the gateway with perf record")
    p.add_argument(
        "--idle-s",
        type=float,
        default=0.0,
        help="measure this many seconds with no request instead of the bench run",
    )
    p.add_argument("--top", type=int, default=40)
    p.add_argument("--python", default=sys.executable, help="the gateway's interpreter")
    args = p.parse_args()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    frame, _ = load_workload(WorkloadSpec(trace=str(TRACE)))
    replay = frame.iloc[args.skip : args.skip + args.requests].reset_index(drop=True)
    replay["arrival_s"] = replay["arrival_s"] - replay["arrival_s"].iloc[0]
    trace = write_trace(replay, out / "replay.parquet")
    base = free_ports(G)
    cfg = {"ranks": G, "slots": B, "time_scale": 1.0, "port_base": base,
           "log_dir": str(out / "emulator")}  # fmt: skip
    emu = ServerProcess([sys.executable, "-m", "balanceroute.serving.testbed.emulator",
                         json.dumps(cfg)], log=out / "emulator.out", env=clean_env())  # fmt: skip
    urls = [f"http://127.0.0.1:{base + g}" for g in range(G)]
    stats_file = out / "gateway.prof"
    code = PROFILED.format(out=str(stats_file)) if args.profile else MAIN
    port = free_port()
    cmd = [os.path.abspath(args.python), "-c", code, "gateway", "--slots", str(B), "--port", str(port),
           "--router", args.router, *LAYOUTS[args.layout]]  # fmt: skip
    if not args.plain:
        cmd += ["--out", str(out / "gateway"), "--no-mlflow"]
    cmd += args.gateway_args.split()
    for u in urls:
        cmd += ["--rank", u]
    gw = None
    try:
        emu.wait_ready([u + "/health" for u in urls], timeout_s=180, poll_s=0.2)
        quiet = {} if args.plain else {"BALANCEROUTE_LOG_LEVEL": "warning"}
        gw = ServerProcess(cmd, log=out / "gateway.out", env=clean_env(quiet), group=True,
                           cwd=out)  # fmt: skip
        gw.wait_ready([f"http://127.0.0.1:{port}/readyz"], timeout_s=180, poll_s=0.2)
        ps = psutil.Process(gw.pid)
        sampler = None
        if args.perf:
            sampler = subprocess.Popen(["perf", "record", "-e", "cpu-clock", "-F", "997", "-g",
                                        "-p", str(gw.pid), "-o", str(out / "perf.data")],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        if args.profile:
            ps.send_signal(signal.SIGUSR1)
        load_before = os.getloadavg()
        cpu0, parts0, t0 = sum(cpu_s(ps)), cpu_parts(ps), time.time()
        bench = [sys.executable, "-c", MAIN, "bench", "--trace", str(trace), "--requests",
                 str(args.requests), "--load", str(args.load), "--slots", str(B), "--ranks", str(G),
                 "--out", str(out / "bench"), "--model", DEFAULT_MODEL, "--no-progress",
                 "--url", f"http://127.0.0.1:{port}"]  # fmt: skip
        if args.idle_s:
            time.sleep(args.idle_s)
        else:
            subprocess.run(bench, check=True, stdout=subprocess.DEVNULL, env=clean_env())
        cpu, wall = sum(cpu_s(ps)) - cpu0, time.time() - t0
        parts = {k: v - parts0[k] for k, v in cpu_parts(ps).items()}
        if args.profile:
            ps.send_signal(signal.SIGUSR2)
            time.sleep(2.0)
        if sampler is not None:
            sampler.send_signal(signal.SIGINT)
            sampler.wait(60)
    finally:
        if gw is not None:
            gw.terminate(60)
        emu.terminate(60)
    summary = ({"total_output_tokens": 0, "completed": 0, "failed": 0} if args.idle_s
               else json.loads((out / "bench" / "summary.json").read_text()))  # fmt: skip
    tokens = int(summary["total_output_tokens"])
    result: dict[str, Any] = {
        "layout": args.layout, "router": args.router, "profiled": args.profile,
        "requests": args.requests, "load": args.load, "completed": summary["completed"],
        "failed": summary["failed"], "output_tokens": tokens, "wall_s": wall, "cpu_s": cpu,
        "cpu_s_per_s": cpu / wall,
        "cpu_s_per_1k_tokens": cpu / tokens * 1e3 if tokens else None,
        "cpu_parts_s": parts,
        "loadavg_before": list(load_before), "loadavg_after": list(os.getloadavg()),
    }  # fmt: skip
    if args.perf:
        result["perf_by_object"] = perf_objects(out / "perf.data")
    if args.profile and stats_file.exists():
        result.update(top(stats_file, tokens, args.top))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

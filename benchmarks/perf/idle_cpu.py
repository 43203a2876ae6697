"""The gateway's background CPU: what its processes burn each second with no request at all, in
front of an emulated group (G = 8, B = 32, real time), as JSON, one line per layout.

At low load this background (the decision loop's tick, health checks, step counter reads) is
most of the gateway's CPU per relayed token, so ``side_by_side.py``'s CPU column is read with it.

    .venv/bin/python benchmarks/perf/idle_cpu.py                          # every layout, 20 s each
    .venv/bin/python benchmarks/perf/idle_cpu.py --layouts one,inproc --seconds 10
    .venv/bin/python benchmarks/perf/idle_cpu.py --layouts one,inproc --repeats 3 \
        --base-python ../wt-a-base/.venv/bin/python       # this tree's gateway against main's
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import psutil

from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port, free_ports

CLI = [sys.executable, "-c", "import sys; from balanceroute.cli import main; sys.exit(main())"]
LAYOUTS = {"inproc": [], "proto1": ["--relay-workers", "1"]}
G, B = 8, 32


def cpu(proc: psutil.Process) -> float:
    t = proc.cpu_times()
    return t.user + t.system


def one_layout(name: str, urls: list[str], seconds: float, folder: Path,
               python: str = sys.executable) -> dict:  # fmt: skip
    port = free_port()
    args = [python, *CLI[1:], "gateway", "--slots", str(B), "--port", str(port), "--router", "count-jsq",
            "--no-mlflow", *LAYOUTS[name]]  # fmt: skip
    for u in urls:
        args += ["--rank", u]
    gw = ServerProcess(args, log=folder / f"{name}-{port}.out",
                       env=clean_env({"BALANCEROUTE_LOG_LEVEL": "warning"}), group=True)  # fmt: skip
    try:
        gw.wait_ready([f"http://127.0.0.1:{port}/readyz"], 120)
        time.sleep(2.0)
        main = psutil.Process(gw.pid)
        procs = [main, *main.children(recursive=True)]
        before = [cpu(p) for p in procs]
        load = os.getloadavg()[0]
        time.sleep(seconds)
        used = [cpu(p) - b for p, b in zip(procs, before, strict=True)]
    finally:
        gw.terminate(30)
    return {"layout": name, "python": python, "seconds": seconds, "cpu_s_per_s": sum(used) / seconds,
            "main_cpu_s_per_s": used[0] / seconds, "others_cpu_s_per_s": sum(used[1:]) / seconds,
            "processes": len(procs), "loadavg_before": load}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layouts", type=lambda t: t.split(","), default=list(LAYOUTS))
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--base-python", help="another installation's python (a worktree of main with "
                   "its own .venv): each layout measured with it too, alternately")  # fmt: skip
    p.add_argument("--repeats", type=int, default=1, help="rounds over the layouts")
    args = p.parse_args()
    bad = [x for x in args.layouts if x not in LAYOUTS]
    if bad:
        p.error(f"--layouts: unknown {bad}; known: {', '.join(LAYOUTS)}")
    with tempfile.TemporaryDirectory(prefix="idle-cpu-") as tmp:
        folder = Path(tmp)
        base = free_ports(G)
        cfg = {"ranks": G, "slots": B, "time_scale": 1.0, "port_base": base}
        emu = ServerProcess([sys.executable, "-m", "balanceroute.serving.testbed.emulator",
                             json.dumps(cfg)], log=folder / "emu.out", env=clean_env())  # fmt: skip
        urls = [f"http://127.0.0.1:{base + g}" for g in range(G)]
        try:
            emu.wait_ready([u + "/health" for u in urls], timeout_s=180, poll_s=0.2)
            pythons = [sys.executable] + ([args.base_python] if args.base_python else [])
            for _ in range(args.repeats):
                for name in args.layouts:
                    for python in pythons:
                        row = one_layout(name, urls, args.seconds, folder, python)
                        print(json.dumps(row), flush=True)
        finally:
            emu.terminate(60)


if __name__ == "__main__":
    main()

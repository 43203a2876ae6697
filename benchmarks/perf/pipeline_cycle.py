"""Wall time of one ``balanceroute pipeline`` cycle on a completion log of 20,000 requests.

A completion log in the gateway's format (``part-*.parquet`` with the gateway's columns and
``log.json``, serving/lifecycle/completion_log.py) is written from a synthetic trace (paper-prod by
default): first its earlier requests, on which a quick cycle (``survival`` only) makes the
champion; then the rest, and the timed cycle reads the whole log as its window with the default
candidates, so it scores the champion on the newer requests, measures the twin prior on them,
registers, promotes or not. Each cycle runs as its own ``balanceroute`` process at ``--nice``
(19 unless told: 0 for a timing on a quiet machine) in a fresh folder with its own SQLite MLflow
store. Prints JSON: the timed cycle's wall time, its steps' durations (from its log), exit code
and outcome, and the load average before and after (the machine is shared).

    .venv/bin/python benchmarks/perf/pipeline_cycle.py [--requests 20000] [--new 6000]
        [--preset paper-prod] [--group 8x32] [--twin-windows N] [--nice 19]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from balanceroute.features.synthetic import generate

CLI = [sys.executable, "-m", "balanceroute.cli", "pipeline"]
STEP_DONE = re.compile(r"pipeline step (\w+): done \(([0-9.]+)s\)")


def write_part(folder: Path, frame, index: int) -> None:
    """One part of a completion log, with every column the gateway writes."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log.json").write_text(json.dumps({"origin_epoch_s": 1.7e9}))
    n = len(frame)
    table = pa.table({
        "request_id": frame["request_id"].astype(str).to_numpy(),
        "arrival_s": frame["arrival_s"].to_numpy(),
        "prompt_tokens": frame["prompt_tokens"].to_numpy(),
        "output_tokens": frame["output_tokens"].to_numpy(),
        "prompt_key": frame["prompt_key"].astype(str).to_numpy(),
        "worker": [i % 8 for i in range(n)],
        "arm": ["brh"] * n,
        "queue_delay_s": [0.0] * n,
        "finish_s": frame["arrival_s"].to_numpy() + 1.0,
        "finish_reason": ["length"] * n,
    })  # fmt: skip
    first_ms = int((1.7e9 + float(frame["arrival_s"].iloc[0])) * 1e3)
    pq.write_table(table, folder / f"part-{first_ms:013d}-{index:05d}.parquet")


def cycle(work: Path, args: list[str], nice: int = 19) -> tuple[int, float, dict, dict]:
    """One pipeline process at ``nice``: exit code, wall seconds, its JSON answer and the
    seconds of each step it logged."""
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    env.pop("MLFLOW_TRACKING_URI", None)
    t0 = time.perf_counter()
    done = subprocess.run(["nice", "-n", str(nice), *CLI, *args], cwd=work, env=env,
                          capture_output=True, text=True, check=False)  # fmt: skip
    wall = time.perf_counter() - t0
    (work / f"cycle-{int(t0)}.err").write_text(done.stderr)
    try:
        answer = json.loads(done.stdout)
    except ValueError:
        answer = {"stderr_tail": done.stderr[-2000:]}
    steps = {m[1]: float(m[2]) for m in STEP_DONE.finditer(done.stderr)}
    return done.returncode, wall, answer, steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=20_000)
    p.add_argument("--new", type=int, default=6_000, help="requests after the champion's window")
    p.add_argument("--preset", default="paper-prod")
    p.add_argument("--group", default="8x32")
    p.add_argument("--twin-windows", help="windows of the twin's prior (the pipeline's default)")
    p.add_argument("--nice", type=int, default=19, help="nice level of the cycles (19)")
    a = p.parse_args()
    trace = generate(a.preset, a.requests, seed=0)
    old, new = trace.iloc[: a.requests - a.new], trace.iloc[a.requests - a.new :]
    with tempfile.TemporaryDirectory(prefix="pipeline-bench-") as tmp:
        work = Path(tmp)
        log = work / "completions"
        write_part(log, old, 0)
        seed_code, seed_wall, _, _ = cycle(work, ["--log", str(log), "--estimators", "survival",
                                                  "--window-rows", str(len(old)), "--group", a.group],
                                           a.nice)  # fmt: skip
        write_part(log, new, 1)
        load_before = os.getloadavg()
        timed = ["--log", str(log), "--window-rows", str(a.requests), "--group", a.group]
        if a.twin_windows:
            timed += ["--twin-windows", a.twin_windows]
        code, wall, answer, steps = cycle(work, timed, a.nice)
        load_after = os.getloadavg()
        uptime = subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()
    print(json.dumps({
        "requests": a.requests, "new_requests": a.new, "preset": a.preset, "group": a.group,
        "twin_windows": a.twin_windows or "default", "nice": a.nice,
        "seed_cycle": {"exit_code": seed_code, "wall_s": round(seed_wall, 1)},
        "cycle": {"exit_code": code, "wall_s": round(wall, 1), "steps_s": steps,
                  "outcome": answer.get("outcome"), "answer": answer},
        "loadavg_before": load_before, "loadavg_after": load_after, "uptime_after": uptime,
        "cpus": os.cpu_count(),
    }, indent=2, default=str))  # fmt: skip


if __name__ == "__main__":
    main()

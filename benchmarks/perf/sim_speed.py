"""Simulator speed: simulated iterations per second with ``count-jsq`` (prints JSON).

Targets (issue 2): at least 20,000 iterations/s at G=8, B=64 on the Azure trace and 2,000 at
G=128, B=64 on a synthetic trace, on a 2-core machine. Medians of ``--runs`` runs; the machine
is shared, so absolute figures move from run to run.

    .venv/bin/python benchmarks/perf/sim_speed.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from balanceroute.features.loaders import load_trace
from balanceroute.features.schema import to_arrays
from balanceroute.features.synthetic import generate
from balanceroute.router.lab.prefill import PrefillConfig, release
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.baselines import CountJSQPolicy

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"


def measure(frame, workers: int, slots: int, saturate: bool, runs: int) -> dict:
    rq = release(to_arrays(frame), PrefillConfig(saturate=saturate))
    rates, iters = [], 0
    for _ in range(runs):
        res = simulate(
            rq, CountJSQPolicy(), SimConfig(workers=workers, slots=slots, record_loads=False)
        )
        iters = res.iterations
        rates.append(res.iterations / res.sim_wall_s)
    return {
        "workers": workers,
        "slots": slots,
        "requests": len(frame),
        "saturated": saturate,
        "iterations": iters,
        "iterations_per_s_median": round(statistics.median(rates)),
        "iterations_per_s_runs": [round(r) for r in rates],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    args = ap.parse_args()
    out = {}
    azure = DATA / "azure_llm_2023_conv.csv"
    if azure.exists():
        frame = load_trace(azure)
        out["azure_g8_b64_trace_rate"] = measure(frame, 8, 64, False, args.runs)
        out["azure_g8_b64_saturated"] = measure(frame, 8, 64, True, args.runs)
    else:
        out["azure"] = f"skipped: {azure} not found"
    synth = generate("azure-conv", 200_000, seed=0)
    out["synthetic_g128_b64_saturated"] = measure(synth, 128, 64, True, args.runs)
    out["targets"] = {"g8_iterations_per_s": 20_000, "g128_iterations_per_s": 2_000}
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

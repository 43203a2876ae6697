"""Router cost per routing call in steady state (prints JSON).

The decode tier runs saturated with a waiting pool held near ``--pool`` requests: request ``i``
is released when request ``i - pool`` was admitted in a first count-JSQ pass, so every routing
call sees a realistic pool. Policies run alternately ``--runs`` times; figures are medians of
the per-run medians and p99s, and ratios are taken run by run (the machine is shared and noisy).
The completion hook (projection upkeep when requests finish) is charged to the routing call.

Arms: ``brh`` is the recommended configuration (predictions refreshed every iteration),
``brh-refresh8`` the same refreshed every 8, ``brh-paper`` the paper's (every 80); all with
the oracle estimator, whose prediction cost is a few array lookups.

Targets (issue 3): at G=8, B=64, H=80, R_max=4 with a pool of 256, BR-H median <= 100 us,
p99 <= 400 us and <= 1.5x count-JSQ's median; at G=128 median <= 2 ms.

    .venv/bin/python benchmarks/perf/router_latency.py [--runs 3] [--pool 256]
"""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from balanceroute.features.loaders import load_trace
from balanceroute.features.schema import to_arrays
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import build_estimator
from balanceroute.router.baselines import CountJSQPolicy
from balanceroute.router.prefill import PrefillConfig, release
from balanceroute.router.simulator import SimConfig, simulate
from balanceroute.router.specs import RouterSpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ARMS = {
    "count-jsq": "count-jsq",
    "br0": "br0",
    "brh": "brh:oracle",
    "brh-refresh8": "brh:oracle{refresh=8}",
    "brh-paper": "brh-paper:oracle",
}


def pooled_releases(frame, workers: int, slots: int, pool: int):
    """Releases that keep about ``pool`` requests waiting (from a count-JSQ pass)."""
    rq = release(to_arrays(frame), PrefillConfig(saturate=True))
    first = simulate(
        rq, CountJSQPolicy(), SimConfig(workers=workers, slots=slots, record_loads=False)
    )
    admit = first.admit_s  # FCFS: admission times are non-decreasing in release order
    rel = np.zeros(rq.size)
    rel[pool:] = admit[: rq.size - pool]
    return replace(rq, release_s=np.maximum.accumulate(rel))


def run_arm(name, rq, frame, workers, slots):
    spec = RouterSpec.parse(ARMS[name])
    est = None
    if spec.estimator is not None:
        est = build_estimator(spec.estimator, replay=frame, horizon=spec.horizon or 80)
    policy = spec.build_policy(est)
    res = simulate(rq, policy, SimConfig(workers=workers, slots=slots, record_loads=False))
    us = res.router_ns[1:] / 1e3  # the first call loads compiled kernels
    return float(np.median(us)), float(np.percentile(us, 99))


def study(frame, workers, slots, pool, runs, arms):
    rq = pooled_releases(frame, workers, slots, pool)
    med = {a: [] for a in arms}
    p99 = {a: [] for a in arms}
    for _ in range(runs):
        for a in arms:
            m, p = run_arm(a, rq, frame, workers, slots)
            med[a].append(m)
            p99[a].append(p)
    base = med["count-jsq"]
    out = {"workers": workers, "slots": slots, "pool": pool, "requests": len(frame)}
    for a in arms:
        out[a] = {
            "median_us": round(statistics.median(med[a]), 1),
            "p99_us": round(statistics.median(p99[a]), 1),
            "ratio_to_count_jsq_median": round(
                statistics.median([x / b for x, b in zip(med[a], base, strict=True)]), 2
            ),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pool", type=int, default=256)
    args = ap.parse_args()
    azure = DATA / "azure_llm_2023_conv.csv"
    frame = load_trace(azure) if azure.exists() else generate("azure-conv", 20_000, seed=0)
    out = {"g8": study(frame, 8, 64, args.pool, args.runs, list(ARMS))}
    big = generate("azure-conv", 60_000, seed=1)
    out["g128"] = study(
        big, 128, 64, args.pool, max(1, args.runs - 1), ["count-jsq", "br0", "brh", "brh-paper"]
    )
    out["targets"] = {
        "g8_brh_median_us": 100,
        "g8_brh_p99_us": 400,
        "g8_brh_ratio_to_count_jsq": 1.5,
        "g128_brh_median_us": 2000,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

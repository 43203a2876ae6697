"""Intervals for a ``side_by_side.py`` run, as JSON: per arm, the median time a request spent
outside the engine before its first token, and against every other arm the difference of the
two medians with a 95% bootstrap interval over the requests (paired: the same requests ran in
every arm, so a request is resampled in both arms at once). The noise floor beside it: the same
interval between the two gateway arms of one build (``count-jsq`` and ``brh`` route a lone
arrival alike at low load); with ``--base-python`` each gateway arm against the same arm of the
other build (``vs_base``).

Issue 20's TTFT target reads off ``gateway[inproc]:ROUTER`` against the best peer: the upper end
of the interval at most 1 ms.

    .venv/bin/python benchmarks/perf/side_by_side_intervals.py runs/side_by_side > runs/intervals.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.serving.testbed.emulator.iterlog import read_log

PEERS = ("sglang-router", "vllm-router")


def outside(arm: Path) -> pd.Series:
    """Per request id: client TTFT minus the engine's arrival-to-first-chunk time, in ms."""
    client = pd.read_parquet(arm / "bench" / "requests.parquet").set_index("request_id")["ttft_s"]
    _, rq = read_log(arm / "emulator")
    rq = rq.drop_duplicates("request_id", keep=False).set_index("request_id")
    both = pd.concat([client, rq["first_sent_s"] - rq["recv_s"]], axis=1, join="inner").dropna()
    return (both.iloc[:, 0] - both.iloc[:, 1]) * 1e3


def median_gap(a: pd.Series, b: pd.Series, reps: int, rng: np.random.Generator) -> dict:
    """median(a) - median(b) over the requests both have, with a paired 95% bootstrap interval."""
    both = pd.concat([a, b], axis=1, join="inner").to_numpy()
    n = both.shape[0]
    idx = rng.integers(0, n, size=(reps, n))
    gaps = np.median(both[idx, 0], axis=1) - np.median(both[idx, 1], axis=1)
    lo, hi = np.percentile(gaps, [2.5, 97.5])
    gap = float(np.median(both[:, 0]) - np.median(both[:, 1]))
    return {"gap_ms": round(gap, 3), "ci95_ms": [round(float(lo), 3), round(float(hi), 3)],
            "requests": n}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path, help="a side_by_side.py --out folder")
    p.add_argument("--reps", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    rng = np.random.default_rng(args.seed)
    result = {}
    for load_dir in sorted(args.out.glob("load-*")):
        arms = {d.name: outside(d) for d in sorted(load_dir.iterdir())
                if (d / "bench" / "requests.parquet").exists()}  # fmt: skip
        peers = {n: s for n, s in arms.items() if n.split("-router")[0] + "-router" in PEERS}
        best = min(peers, key=lambda n: float(np.median(peers[n]))) if peers else None
        rows = {}
        for name, s in arms.items():
            row: dict = {"outside_p50_ms": round(float(np.median(s)), 3)}
            if "direct" in arms and name != "direct":
                row["vs_direct"] = median_gap(s, arms["direct"], args.reps, rng)
            if best is not None and name != best:
                row["vs_best_peer"] = median_gap(s, peers[best], args.reps, rng)
            base = "base" + name.removeprefix("gateway") if name.startswith("gateway[") else None
            if base in arms:  # this build against the one before (--base-python)
                row["vs_base"] = median_gap(s, arms[base], args.reps, rng)
            rows[name] = row
        for prefix in sorted({n.split("]")[0] + "]" for n in arms if "]" in n}):
            jsq, brh = f"{prefix}-count-jsq", f"{prefix}-brh"
            if jsq in arms and brh in arms:
                rows[f"noise_floor:{prefix}"] = median_gap(arms[brh], arms[jsq], args.reps, rng)
        result[load_dir.name] = {"best_peer": best, "arms": rows}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""Time and peak memory to train each estimator on a 1,000,000-request trace, side by side.

Every fit runs in a child process of its own (so peak memory is that fit's), which generates the
synthetic trace (preset paper-prod by default) and fits one estimator the way ``balanceroute
train`` does (70% of the requests). Per estimator: the median over ``--repeats`` children of the
fit's seconds and of the child's peak RSS (``ru_maxrss``) after the fit, next to the peak before
it (trace generation and split); then ``hazard`` over ``gbdt`` as ratios of the medians of fit
time and of the peak RSS the fit added. The load average is printed with the result: the
machine is shared. Prints JSON.

    .venv/bin/python benchmarks/perf/train_scale.py [--requests 1000000] [--repeats 3]
        [--estimators survival,exactmatch,gbdt,hazard]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from balanceroute.features.split import time_split
from balanceroute.features.synthetic import generate
from balanceroute.predict.registry import make_estimator


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def fit_one(kind: str, requests: int, preset: str, seed: int) -> dict:
    """Generate, split, fit one estimator; its time and the process's peak memory."""
    trace = generate(preset, requests, seed=seed)
    train, _ = time_split(trace, 0.7)
    del trace
    before = _peak_rss_mb()
    t0 = time.perf_counter()
    est = make_estimator(kind, **({"key": "hash"} if kind == "exactmatch" else {}))
    est.fit(train)
    out = {
        "kind": kind,
        "train_requests": len(train),
        "fit_seconds": time.perf_counter() - t0,
        "peak_rss_before_fit_mb": before,
        "peak_rss_mb": _peak_rss_mb(),
    }
    if hasattr(est, "n_rows_"):
        out["rows"] = est.n_rows_
    return out


def child(kind: str, args: argparse.Namespace) -> dict:
    """One fit in a fresh process."""
    cmd = [sys.executable, __file__, "--only", kind, "--requests", str(args.requests)]
    cmd += ["--preset", args.preset, "--seed", str(args.seed)]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--preset", default="paper-prod")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--estimators", default="survival,exactmatch,gbdt,hazard")
    parser.add_argument("--only", help=argparse.SUPPRESS)  # child mode: one fit, one JSON line
    args = parser.parse_args()
    if args.only:
        print(json.dumps(fit_one(args.only, args.requests, args.preset, args.seed)))
        return
    kinds = args.estimators.split(",")
    load_before = os.getloadavg()
    runs: dict[str, list[dict]] = {k: [] for k in kinds}
    for r in range(args.repeats):
        for kind in kinds:  # interleaved, so a busy spell hits every estimator alike
            runs[kind].append(child(kind, args))
            print(f"repeat {r}: {kind} done", file=sys.stderr, flush=True)
    out: dict = {"requests": args.requests, "preset": args.preset, "repeats": args.repeats}
    for kind, rs in runs.items():
        med = {
            k: round(statistics.median(x[k] for x in rs), 2)
            for k in ("fit_seconds", "peak_rss_before_fit_mb", "peak_rss_mb")
        }
        med["fit_added_rss_mb"] = round(
            statistics.median(x["peak_rss_mb"] - x["peak_rss_before_fit_mb"] for x in rs), 1
        )
        if "rows" in rs[0]:
            med["rows"] = rs[0]["rows"]
        med["train_requests"] = rs[0]["train_requests"]
        out[kind] = med
    if "gbdt" in out and "hazard" in out:
        g, h = out["gbdt"], out["hazard"]
        out["hazard_over_gbdt"] = {
            "fit_seconds": round(h["fit_seconds"] / g["fit_seconds"], 2),
            "peak_rss": round(h["peak_rss_mb"] / g["peak_rss_mb"], 2),
            "fit_added_rss": round(h["fit_added_rss_mb"] / max(g["fit_added_rss_mb"], 1.0), 2),
        }
    out["load_average_before_after"] = [round(x, 2) for x in (*load_before, *os.getloadavg())]
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

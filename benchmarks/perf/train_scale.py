"""Time and peak memory to train survival, exactmatch and gbdt on a 1,000,000-request trace.

Generates the synthetic trace (preset paper-prod by default), then fits the three estimators the
way ``balanceroute train`` does (70% of the requests), each timed. Peak RSS is the process's
``ru_maxrss`` (generation included). Prints JSON.

    .venv/bin/python benchmarks/perf/train_scale.py [--requests 1000000] [--preset paper-prod]
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time

from balanceroute.features.split import time_split
from balanceroute.features.synthetic import generate
from balanceroute.predict.registry import make_estimator


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1_000_000)
    parser.add_argument("--preset", default="paper-prod")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    trace = generate(args.preset, args.requests, seed=args.seed)
    train, _ = time_split(trace, 0.7)
    out: dict = {
        "requests": args.requests,
        "preset": args.preset,
        "train_requests": len(train),
        "generate_seconds": round(time.perf_counter() - t0, 2),
        "fit_seconds": {},
    }
    t_all = time.perf_counter()
    for kind in ("survival", "exactmatch", "gbdt"):
        t1 = time.perf_counter()
        est = make_estimator(kind, **({"key": "hash"} if kind == "exactmatch" else {}))
        est.fit(train)
        out["fit_seconds"][kind] = round(time.perf_counter() - t1, 2)
        if kind == "gbdt":
            out["gbdt_rows"] = est.n_rows_
        print(f"{kind}: {out['fit_seconds'][kind]}s", file=sys.stderr, flush=True)
    out["train_all_seconds"] = round(time.perf_counter() - t_all, 2)
    out["total_seconds"] = round(time.perf_counter() - t0, 2)
    out["peak_rss_mb"] = round(_peak_rss_mb(), 1)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

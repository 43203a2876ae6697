"""Predictor accuracy on the shared traces: Brier, AUC, ECE, log loss, c MAE, predictions/s.

Time-ordered 70/30 split, H=80, three snapshots per test request at seeded random ages, prequential
replay (test completions observed before each snapshot). Azure uses the exact prompt length as the
key; Mooncake the hash of the first two blocks. Also compares exactmatch's shrinkage with the hard
switch, and gbdt's calibrations (none / isotonic / platt, and platt without the online
recalibration). ``predictions_per_s`` is the best of 5 timed ``predict`` calls on a 4,096 batch (as
``balanceroute evaluate`` reports it); gbdt also gets ``predictions_per_s_median``, the median of
21 such calls, since the machine is shared and timings are noisy. Prints JSON.

    .venv/bin/python benchmarks/studies/predictor_accuracy.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

from balanceroute.features.loaders import load_trace
from balanceroute.predict.base import RunningBatch
from balanceroute.predict.registry import make_estimator
from balanceroute.training.evaluate import evaluate_estimator
from balanceroute.training.holdout import Holdout, make_holdout

TRACES = {
    "azure": ("azure_llm_2023_conv.csv", "exact-length"),
    "mooncake": ("mooncake_conversation.jsonl", "hash"),
}
METRICS = ("brier", "auc", "ece", "log_loss", "c_mae", "predictions_per_s")


def _brief(m: dict) -> dict:
    return {k: round(float(m[k]), 5) for k in METRICS}


def median_predictions_per_s(est, holdout: Holdout, batch: int = 4096, runs: int = 21) -> float:
    """Median throughput of ``predict`` over ``runs`` calls on one batch of test snapshots."""
    take = np.resize(np.arange(holdout.index.size), batch)
    a, idx = holdout.arrays, holdout.index[take]
    rb = RunningBatch(a.prompt_tokens[idx], holdout.age[take], a.prompt_key[idx], idx, None)
    est.predict(rb)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        est.predict(rb)
        times.append(time.perf_counter() - t0)
    return batch / float(np.median(times))


def run(data: Path, horizon: int) -> dict:
    results: dict = {}
    for name, (file, key) in TRACES.items():
        path = data / file
        if not path.is_file():
            results[name] = {"skipped": f"{path} not found"}
            continue
        holdout = make_holdout(load_trace(path, key_blocks=2))
        res: dict = {
            "key": key,
            "n_train": holdout.first_test,
            "snapshots": int(holdout.index.size),
        }
        variants = {
            "survival": ("survival", {}),
            "exactmatch": ("exactmatch", {"key": key}),
            "exactmatch[switch]": ("exactmatch", {"key": key, "blend": "switch"}),
        }
        for label, (kind, params) in variants.items():
            est = make_estimator(kind, horizon=horizon, **params).fit(holdout.train)
            res[label] = _brief(evaluate_estimator(est, holdout, horizon)[0])
        t0 = time.perf_counter()
        gbdt = make_estimator("gbdt", horizon=horizon).fit(holdout.train)
        fit_s = time.perf_counter() - t0
        for cal in ("platt", "platt-static", "isotonic", "none"):
            est = copy.deepcopy(gbdt)
            est.calibration = cal.removesuffix("-static")
            est.recalibrate = gbdt.recalibrate and cal == "platt"
            label = "gbdt" if cal == gbdt.calibration else f"gbdt[{cal}]"
            res[label] = _brief(evaluate_estimator(est, holdout, horizon)[0])
        res["gbdt"]["predictions_per_s_median"] = round(median_predictions_per_s(gbdt, holdout))
        res["gbdt"]["fit_seconds"] = round(fit_s, 2)
        res["gbdt"]["calibration_holdout"] = {
            k: round(v, 5) for k, v in gbdt.calibration_report_.items()
        }
        results[name] = res
        print(f"{name}: done", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[2] / "shared" / "data"
    parser.add_argument("--data", type=Path, default=default, help="folder of the shared traces")
    parser.add_argument("--horizon", type=int, default=80)
    args = parser.parse_args()
    print(json.dumps(run(args.data, args.horizon), indent=2))


if __name__ == "__main__":
    main()

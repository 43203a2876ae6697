"""Predictor accuracy on the shared traces: the per-request scores and the decision-aware ones.

Time-ordered 70/30 split, H=80, three snapshots per test request at seeded random ages, prequential
replay (test completions observed before each snapshot), as ``balanceroute evaluate`` scores. Per
estimator: the per-request scores of ``p_finish`` (Brier, AUC, ECE, log loss, c MAE), the
decision-aware scores weighted by time at risk (discounted integrated Brier score at BR-H's
``auto_gamma`` discount, Brier and AUC at k = 8, 16, 40, 80) and the projection error on states
of a ``brh:none`` replay (G = 8, B = 32, saturated), plus ``none`` as the reference and the
recommendation ``evaluate`` would print. Azure uses the exact prompt length as the key; Mooncake the
hash of the first two blocks. ``hazard`` also runs as ``hazard[per-request]`` (training snapshots
weighted per request, like ``gbdt``), ``hazard[static]`` (no online recalibration) and
``hazard[conversation]`` (with the features of the key's last finished request: on Mooncake,
the previous turn of the conversation).
``--variants`` adds the older comparisons: exactmatch's shrinkage against the hard switch, and
gbdt's calibrations (none / isotonic / platt, and platt without the online recalibration).
``predictions_per_s`` is the best of 5 timed ``predict`` calls on a 4,096 batch; the learned
estimators also get ``predictions_per_s_median`` (21 calls) and ``fit_seconds``. Prints JSON.

    .venv/bin/python benchmarks/studies/predictor_accuracy.py [--data ../shared/data] [--variants]
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import time
from pathlib import Path

import numpy as np

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.loaders import load_trace
from balanceroute.predict.base import RunningBatch
from balanceroute.predict.registry import make_estimator
from balanceroute.training.evaluate import evaluate_estimator, score_estimators
from balanceroute.training.holdout import Holdout, make_holdout
from balanceroute.training.recommend import recommend

TRACES = {
    "azure": ("azure_llm_2023_conv.csv", "exact-length"),
    "mooncake": ("mooncake_conversation.jsonl", "hash"),
}
METRICS = (
    "brier",
    "auc",
    "ece",
    "log_loss",
    "c_mae",
    "ibs_discounted",
    "ibs_discounted_per_request",
    "brier_at_8",
    "brier_at_16",
    "brier_at_40",
    "brier_at_80",
    "auc_at_8",
    "auc_at_16",
    "auc_at_40",
    "auc_at_80",
    "proj_error",
    "proj_error_margin",
    "predictions_per_s",
)
LEARNED = ("gbdt", "hazard", "hazard[per-request]", "hazard[static]", "hazard[conversation]")


def _brief(m: dict) -> dict:
    return {k: round(float(m[k]), 5) for k in METRICS if k in m}


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


def variants(key: str) -> dict[str, tuple[str, dict]]:
    """The estimators scored on every trace: label -> (kind, parameters)."""
    return {
        "survival": ("survival", {}),
        "exactmatch": ("exactmatch", {"key": key}),
        "gbdt": ("gbdt", {}),
        "hazard": ("hazard", {}),
        "hazard[per-request]": ("hazard", {"at_risk": False}),
        "hazard[static]": ("hazard", {"recalibrate": False}),
        "hazard[conversation]": ("hazard", {"conversation": True}),
    }


def older_variants(holdout: Holdout, key: str, horizon: int, gbdt) -> dict[str, dict]:
    """exactmatch's hard switch and gbdt's calibrations (the comparisons of release 0.1.0)."""
    out = {}
    est = make_estimator("exactmatch", horizon=horizon, key=key, blend="switch")
    out["exactmatch[switch]"] = _brief(
        evaluate_estimator(est.fit(holdout.train), holdout, horizon)[0]
    )
    for cal in ("platt-static", "isotonic", "none"):
        est = copy.deepcopy(gbdt)
        est.calibration = cal.removesuffix("-static")
        est.recalibrate = False
        out[f"gbdt[{cal}]"] = _brief(evaluate_estimator(est, holdout, horizon)[0])
    return out


def run(data: Path, horizon: int, with_variants: bool) -> dict:
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
        fitted, fit_s = {}, {}
        for label, (kind, params) in variants(key).items():
            t0 = time.perf_counter()
            fitted[label] = make_estimator(kind, horizon=horizon, **params).fit(holdout.train)
            fit_s[label] = time.perf_counter() - t0
            print(f"{name}: fitted {label} in {fit_s[label]:.1f} s", file=sys.stderr, flush=True)
        pristine = {k: copy.deepcopy(e) for k, e in fitted.items()}
        metrics, _ = score_estimators(fitted, holdout, horizon)
        for label, m in metrics.items():
            res[label] = _brief(m)
            if label in LEARNED:
                res[label]["fit_seconds"] = round(fit_s[label], 2)
                res[label]["predictions_per_s_median"] = round(
                    median_predictions_per_s(pristine[label], holdout)
                )
        res["gamma"] = round(float(metrics["none"]["gamma"]), 4)
        deployable = {k for k in metrics if "[" not in k}
        rec = recommend(metrics, deployable=deployable)
        res["recommendation"] = {"pick": rec.pick, "score": rec.score}
        if with_variants:
            res.update(older_variants(holdout, key, horizon, pristine["gbdt"]))
        results[name] = res
        print(f"{name}: done", file=sys.stderr, flush=True)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default = Path(__file__).resolve().parents[3] / "shared" / "data"
    parser.add_argument("--data", type=Path, default=default, help="folder of the shared traces")
    parser.add_argument("--horizon", type=int, default=DEFAULT_HORIZON)
    parser.add_argument("--variants", action="store_true", help="also the older comparisons")
    args = parser.parse_args()
    print(json.dumps(run(args.data, args.horizon, args.variants), indent=2))


if __name__ == "__main__":
    main()

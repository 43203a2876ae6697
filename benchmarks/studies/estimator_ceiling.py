"""How far the learned estimators are from what a synthetic trace makes knowable.

Scores, on one holdout of a trace (the later ``1 - train_fraction`` of its requests, three
snapshots each, as ``train`` does), the decision-aware scores (``ibs_discounted``, Brier at
8-80 iterations) of the learned estimators fitted on the earlier part, of ``posterior`` (each
request's true output law, regenerated from the preset: the most any estimator can know) and of
``none``. Prints JSON.

    python benchmarks/studies/estimator_ceiling.py --trace history.parquet --preset paper-prod \
        --estimators gbdt,exactmatch,gbdt{weighting=time-at-risk;curve=key}
"""

from __future__ import annotations

import argparse
import json

import pandas as pd

from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.posterior import PosteriorEstimator
from balanceroute.predict.registry import make_estimator
from balanceroute.training.evaluate import evaluate_estimator
from balanceroute.training.holdout import make_holdout

KEEP = (
    "ibs_discounted",
    "ibs_discounted_per_request",
    "brier",
    "auc",
    "brier_at_8",
    "brier_at_16",
    "brier_at_40",
    "brier_at_80",
    "auc_at_80",
    "c_mae",
)


def parse_estimator(text: str) -> tuple[str, dict[str, str]]:
    """``kind{name=value;...}`` as a kind and its parameter overrides."""
    kind, _, rest = text.partition("{")
    items = filter(None, rest.rstrip("}").split(";"))
    return kind, dict(item.split("=", 1) for item in items)


def fitted(text: str, train: pd.DataFrame, horizon: int) -> CompletionEstimator:
    """The estimator ``text`` fitted on ``train``."""
    kind, params = parse_estimator(text)
    return make_estimator(kind, horizon=horizon, **params).fit(train)


def main() -> None:
    """Score every estimator on the holdout and print the scores as JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--preset", default="paper-prod")
    ap.add_argument("--trace-seed", type=int, default=0)
    ap.add_argument("--estimators", default="gbdt,exactmatch")
    ap.add_argument("--train-fraction", type=float, default=0.5)
    ap.add_argument("--horizon", type=int, default=80)
    args = ap.parse_args()
    trace = pd.read_parquet(args.trace)
    holdout = make_holdout(trace, args.train_fraction)
    whole = pd.concat([holdout.train, holdout.test], ignore_index=True)
    candidates: dict[str, CompletionEstimator] = {
        "posterior": PosteriorEstimator(
            horizon=args.horizon, preset=args.preset, trace_seed=args.trace_seed
        ).fit(whole),
        "none": make_estimator("none", horizon=args.horizon).fit(),
    }
    for text in filter(None, args.estimators.split(",")):
        candidates[text] = fitted(text, holdout.train, args.horizon)
    out = {}
    for label, est in candidates.items():
        metrics, _ = evaluate_estimator(est, holdout, args.horizon)
        out[label] = {k: round(float(metrics[k]), 5) for k in KEEP if k in metrics}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()

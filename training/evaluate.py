"""Evaluate estimators on the time-ordered holdout: metrics, by-age metrics, plots, metrics.json."""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.causal import CausalConfig
from balanceroute.features.schema import TraceArrays, to_arrays
from balanceroute.predict.base import CompletedBatch, CompletionEstimator
from balanceroute.training.metrics import reliability, score, score_by_age
from balanceroute.training.plots import brier_by_age_plot, reliability_plot
from balanceroute.training.replay import predictions_per_second, replay_predict
from balanceroute.training.snapshots import holdout_snapshots
from balanceroute.training.split import time_split

SNAPSHOTS_PER_REQUEST = 3


@dataclass(frozen=True, slots=True)
class Holdout:
    """A trace split in time, with the seeded test snapshots every estimator is scored on."""

    train: pd.DataFrame
    arrays: TraceArrays  # the whole trace, train rows first
    first_test: int
    index: np.ndarray
    age: np.ndarray

    @property
    def remaining(self) -> np.ndarray:
        return self.arrays.output_tokens[self.index] - self.age


def make_holdout(trace: pd.DataFrame, train_fraction: float = 0.7, seed: int = 0) -> Holdout:
    """Split ``trace`` in time and draw three snapshots per test request at random ages."""
    train, test = time_split(trace, train_fraction)
    arrays = to_arrays(pd.concat([train, test], ignore_index=True))
    index, age = holdout_snapshots(arrays.output_tokens, len(train), SNAPSHOTS_PER_REQUEST, seed)
    return Holdout(train, arrays, len(train), index, age)


def warm_up(estimator: CompletionEstimator, holdout: Holdout, cfg: CausalConfig) -> None:
    """Observe the training requests in finish order (for a model fitted on other data)."""
    a = holdout.arrays
    n = holdout.first_test
    finish = cfg.finish_times(a)[:n]
    o = np.argsort(finish, kind="stable")
    estimator.observe(
        CompletedBatch(a.prompt_tokens[o], a.output_tokens[o], a.prompt_key[o], finish[o])
    )


def evaluate_estimator(
    estimator: CompletionEstimator, holdout: Holdout, horizon: int
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Metrics (with ``by_age`` and ``predictions_per_s``) and reliability curve of one estimator."""
    res = replay_predict(estimator, holdout.arrays, holdout.first_test, holdout.index, holdout.age)
    r = holdout.remaining
    metrics: dict[str, Any] = score(res.p_finish, res.c, r, horizon)
    metrics["predictions_per_s"] = predictions_per_second(
        estimator, holdout.arrays, holdout.index, holdout.age
    )
    metrics["replay_steps"] = res.steps
    metrics["by_age"] = score_by_age(res.p_finish, res.c, r, holdout.age, horizon)
    y = (r <= horizon).astype(np.float64)
    return metrics, reliability(res.p_finish, y)


def write_report(
    out_dir: Path,
    metrics: dict[str, dict[str, Any]],
    curves: dict[str, dict[str, list[float]]],
) -> dict[str, Path]:
    """metrics.json and the two plots in ``out_dir``; returns their paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"metrics": out_dir / "metrics.json"}
    paths["metrics"].write_text(json.dumps(metrics, indent=2, sort_keys=True) + "\n")
    paths["reliability"] = reliability_plot(curves, out_dir / "reliability.png")
    by_age = {k: m["by_age"] for k, m in metrics.items()}
    paths["brier_by_age"] = brier_by_age_plot(by_age, out_dir / "brier_by_age.png")
    return paths


def progress(message: str) -> None:
    """One progress line on stderr."""
    print(f"[balanceroute] {message}", file=sys.stderr, flush=True)


def flat_metrics(metrics: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``kind.metric`` and ``kind.age_<bucket>.metric`` floats, for MLflow."""
    flat: dict[str, float] = {}
    for kind, m in metrics.items():
        for name, value in m.items():
            if name == "by_age":
                for bucket, bm in value.items():
                    for bname in ("brier", "auc", "ece"):
                        v = bm[bname]
                        if np.isfinite(v):
                            flat[f"{kind}.age_{bucket.replace('+', 'plus')}.{bname}"] = float(v)
            elif isinstance(value, int | float) and np.isfinite(value):
                flat[f"{kind}.{name}"] = float(value)
    return flat

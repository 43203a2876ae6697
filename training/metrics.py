"""Accuracy of completion predictions: AUC, Brier, log loss, calibration error, MAE of ``c``."""

from __future__ import annotations

import itertools

import numpy as np

from balanceroute.predict.calibration import auc, brier_score, expected_calibration_error

__all__ = ["auc", "brier_score", "expected_calibration_error", "reliability", "score",
           "score_by_age"]  # fmt: skip

AGE_BUCKETS: tuple[int, ...] = (0, 16, 64, 256, 1024)


def reliability(p: np.ndarray, y: np.ndarray, bins: int = 15) -> dict[str, list[float]]:
    """Per bin: mean predicted, observed frequency and count (the reliability diagram)."""
    b = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    n = np.bincount(b, minlength=bins).astype(np.float64)
    safe = np.where(n > 0, n, 1.0)
    return {
        "mean_p": (np.bincount(b, weights=p, minlength=bins) / safe).tolist(),
        "freq": (np.bincount(b, weights=y, minlength=bins) / safe).tolist(),
        "count": n.tolist(),
    }


def score(p: np.ndarray, c: np.ndarray, remaining: np.ndarray, horizon: int) -> dict[str, float]:
    """All metrics for predictions against true remaining lengths ``r``."""
    y = (remaining <= horizon).astype(np.float64)
    pc = np.clip(p, 1e-6, 1 - 1e-6)
    return {
        "auc": auc(p, y),
        "brier": brier_score(p, y),
        "log_loss": float(-np.mean(y * np.log(pc) + (1 - y) * np.log(1 - pc))),
        "ece": expected_calibration_error(p, y),
        "c_mae": float(np.mean(np.abs(c - np.minimum(remaining, horizon)))),
        "n": float(p.size),
        "positive_rate": float(y.mean()) if y.size else float("nan"),
    }


def score_by_age(
    p: np.ndarray, c: np.ndarray, remaining: np.ndarray, age: np.ndarray, horizon: int
) -> dict[str, dict[str, float]]:
    """:func:`score` within age buckets ``[0,16) [16,64) ... [1024, inf)``."""
    edges = (*AGE_BUCKETS, np.iinfo(np.int64).max)
    out: dict[str, dict[str, float]] = {}
    for lo, hi in itertools.pairwise(edges):
        m = (age >= lo) & (age < hi)
        if m.any():
            label = f"{lo}-{hi - 1}" if hi != edges[-1] else f"{lo}+"
            out[label] = score(p[m], c[m], remaining[m], horizon)
    return out

"""Evaluation plots: reliability diagram and Brier score by age bucket, one line per estimator."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from balanceroute.features.files import write_png


def reliability_plot(curves: dict[str, dict[str, list[float]]], path: Path) -> Path:
    """Mean predicted vs observed finish frequency per probability bin."""
    fig, ax = plt.subplots(figsize=(5, 5))
    ax.plot([0, 1], [0, 1], color="grey", linestyle=":", label="perfect")
    for kind, rel in curves.items():
        pts = [
            (p, f) for p, f, n in zip(rel["mean_p"], rel["freq"], rel["count"], strict=True) if n
        ]
        if pts:
            xs, ys = zip(*pts, strict=True)
            ax.plot(xs, ys, marker="o", label=kind)
    ax.set_xlabel("predicted P(finish within H)")
    ax.set_ylabel("observed frequency")
    ax.set_title("Reliability diagram")
    ax.legend()
    return write_png(path, fig)


def brier_by_age_plot(by_age: dict[str, dict[str, dict[str, Any]]], path: Path) -> Path:
    """Brier score per age bucket for every estimator."""
    fig, ax = plt.subplots(figsize=(6, 4))
    for kind, buckets in by_age.items():
        labels = list(buckets)
        ax.plot(labels, [buckets[b]["brier"] for b in labels], marker="o", label=kind)
    ax.set_xlabel("age bucket (tokens generated)")
    ax.set_ylabel("Brier score")
    ax.set_title("Brier score by age")
    ax.legend()
    return write_png(path, fig)

"""A/B plots: worker-load trajectories (the paper's Figure 4), imbalance distributions, scaling."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.features.files import write_png


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def first_repeat(raw: dict[str, Any], label: str, workers: int) -> dict[str, Any]:
    """The replay task of arm ``label`` at ``workers`` workers, first repeat."""
    return next(
        x
        for x in raw["tasks"]
        if x["arm"] == label and x["workers"] == workers and x["repeat"] == 0
    )


def trajectories(raw: dict[str, Any], arms: list[str], workers: int, path: Path) -> Path:
    """Per-worker KV load over a 1,500-iteration steady window, one panel per arm."""
    plt = _plt()
    fig, axes = plt.subplots(len(arms), 1, figsize=(10, 3.2 * len(arms)), squeeze=False)
    for ax, label in zip(axes[:, 0], arms, strict=True):
        t = first_repeat(raw, label, workers)
        loads = np.asarray(t["trajectory"]["loads"])
        xs = t["trajectory"]["start"] + np.arange(loads.shape[0])
        for g in range(loads.shape[1]):
            ax.plot(xs, loads[:, g], lw=0.7)
        ax.set_title(f"{label}: KV tokens per worker (G = {workers})")
        ax.set_xlabel("iteration")
        ax.set_ylabel("KV tokens")
    return write_png(path, fig)


def imbalance_distribution(raw: dict[str, Any], arms: list[str], workers: int, path: Path) -> Path:
    """Box plot of the steady-state per-iteration imbalance of every arm (first repeat)."""
    plt = _plt()
    data = []
    for label in arms:
        t = first_repeat(raw, label, workers)
        data.append(np.asarray(t["imbalance_sample"]))
    fig, ax = plt.subplots(figsize=(max(6, 1.3 * len(arms)), 4))
    ax.boxplot(data, showfliers=False)
    ax.set_xticks(range(1, len(arms) + 1), arms, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("imbalance I(k), tokens")
    ax.set_title(f"Steady-state imbalance per iteration (G = {workers})")
    return write_png(path, fig)


def scaling(agg: dict[str, Any], arms: list[str], workers: tuple[int, ...], path: Path) -> Path:
    """Throughput and steady mean imbalance against G, one line per arm."""
    plt = _plt()
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4))
    for label in arms:
        per = agg["arms"][label]["by_workers"]
        tput = [per[str(g)]["throughput_tok_s"] for g in workers]
        imb = [per[str(g)].get("steady_mean_imbalance") or np.nan for g in workers]
        a1.plot(workers, tput, marker="o", label=label)
        a2.plot(workers, imb, marker="o", label=label)
    a1.set_xlabel("G")
    a1.set_ylabel("throughput tok/s")
    a2.set_xlabel("G")
    a2.set_ylabel("steady mean imbalance")
    a2.set_yscale("log")
    a1.legend(fontsize=7)
    return write_png(path, fig)

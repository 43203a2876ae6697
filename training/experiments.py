"""A/B experiments end to end: the paired replay, its results on disk, and MLflow tracking.

:func:`run_ab_experiment` is what ``balanceroute ab`` runs, callable from Python with the same
result: :func:`balanceroute.router.lab.ab.run_ab` replays every arm, :func:`write_ab_results` writes
the summary, report and plots, and (with ``track``) one MLflow parent run with a child run per
arm records them. A tracking failure never loses the results: they are on disk first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from balanceroute.router.lab.ab import METRICS, ABConfig, run_ab
from balanceroute.router.lab.ab_outputs import ABResults, write_ab_results
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.training.tracking import ChildRun, log_parent_with_children

EXPERIMENT = "balanceroute-ab"


@dataclass(frozen=True)
class ABExperiment:
    """An A/B run's results and where tracking put them (or why it could not)."""

    results: ABResults
    run_id: str | None = None
    tracking_error: str | None = None


def run_ab_experiment(
    frame: pd.DataFrame,
    source: dict[str, Any],
    cfg: ABConfig,
    out: Path,
    *,
    jobs: int = 1,
    dask_scheduler: str | None = None,
    track: bool = True,
    progress: Callable[[str], None] | None = None,
) -> ABExperiment:
    """Replay every arm of ``cfg`` on ``frame``, write the results to ``out``, track them."""
    raw = run_ab(frame, cfg, jobs=jobs, dask_scheduler=dask_scheduler, progress=progress)
    results = write_ab_results(
        raw, cfg, source, out, run={"jobs": jobs, "dask_scheduler": dask_scheduler}
    )
    if not track:
        return ABExperiment(results)
    try:
        return ABExperiment(results, run_id=log_ab(results, raw, cfg, out))
    except Exception as exc:
        return ABExperiment(results, tracking_error=f"{type(exc).__name__}: {exc}")


def log_ab(results: ABResults, raw: dict[str, Any], cfg: ABConfig, out: Path) -> str:
    """Parent run (config, report, plots, summary) with a child run per arm; returns its id."""
    summary = results.summary
    info = raw["info"]
    params = {
        "arms": ",".join(a.label for a in cfg.arms)[:500],
        "workers": ",".join(map(str, cfg.workers)),
        "slots": cfg.slots,
        "repeats": len(info["windows"]),
        "saturate": cfg.saturate,
        "load": cfg.load,
        "rate_scale": cfg.rate_scale,
        "reference": summary["reference"],
        "workload": summary["config"]["workload_text"][:500],
    }
    return log_parent_with_children(
        EXPERIMENT,
        f"ab-{out.name}",
        params,
        (arm_run(arm, summary["arms"][arm.label], info) for arm in cfg.arms),
        tags={"workload_sha256": str(summary["config"]["workload"].get("sha256"))},
        artifacts=[(p, "plots" if p.suffix == ".png" else None) for p in results.files],
    )


def arm_run(arm: RouterSpec, stats: dict[str, Any], info: dict[str, Any]) -> ChildRun:
    """One arm's child run: its router and estimator, where the model came from, its metrics
    and their ratios to the reference arm."""
    est = arm.estimator
    params = {
        "arm": arm.label,
        "router": arm.router,
        "estimator": None if est is None else est.kind,
        "model_uri": None if est is None else est.model_uri,
        **{f"option.{k}": v for k, v in arm.options.items()},
    }
    tags = {}
    reg = info.get("loaded_from_registry", {}).get(arm.label)
    if reg:
        tags["model_version"] = str(reg["version"])
    if arm.label in info.get("trained_on_the_fly", {}):
        tags["estimator_source"] = "trained on the fly"
    metrics = {m: stats[m] for m in METRICS if stats.get(m) is not None}
    ratio = stats.get("ratio_to_reference", {})
    metrics.update({f"{m}_ratio": v["mean"] for m, v in ratio.items()})
    return ChildRun(arm.label, params, metrics, tags)

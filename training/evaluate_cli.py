"""``balanceroute evaluate``: score registered or saved estimators on a trace's holdout."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from balanceroute.features.causal import CausalConfig
from balanceroute.features.errors import UserError
from balanceroute.features.workload import load_workload
from balanceroute.predict.base import CompletionEstimator
from balanceroute.training.evaluate import (
    evaluate_estimator,
    make_holdout,
    progress,
    warm_up,
    write_report,
)
from balanceroute.training.registry import load_estimator


def run_evaluate(
    *,
    trace: str | None,
    preset: str | None,
    requests: int | None,
    seed: int,
    key_blocks: int,
    model_uri: str | None,
    kinds: tuple[str, ...] | None,
    model_name: str,
    horizon: int,
    warmup: bool,
    out: Path,
    key: str = "auto",
) -> dict[str, dict[str, Any]]:
    """Load the models, replay the holdout, write ``out/metrics.json`` and plots."""
    if not model_uri and not kinds:
        raise UserError("give --model-uri or --estimator")
    estimators: dict[str, CompletionEstimator] = {}
    if model_uri:
        est = load_estimator(model_uri, model_name)
        estimators[est.name] = est
    else:
        for kind in kinds or ():
            estimators[kind] = load_estimator(f"models:/{model_name}@{kind}", model_name)
    for est in estimators.values():
        own = getattr(est, "key", None)
        if key != "auto" and own is not None and own != key:
            raise UserError(f"the {est.name} model was trained with key '{own}', not '{key}'")
    frame, source = load_workload(
        trace=trace, preset=preset, requests=requests, seed=seed, key_blocks=key_blocks
    )
    progress(f"loaded {len(frame):,} requests ({source['kind']}, sha256 {source['sha256'][:12]})")
    holdout = make_holdout(frame, seed=seed)
    metrics: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    for kind, est in estimators.items():
        if warmup:
            warm_up(est, holdout, CausalConfig())
        progress(f"evaluating {kind} on {holdout.index.size:,} snapshots")
        metrics[kind], curves[kind] = evaluate_estimator(est, holdout, horizon)
        progress(f"{kind}: brier {metrics[kind]['brier']:.4f} auc {metrics[kind]['auc']:.4f}")
    paths = write_report(out, metrics, curves)
    progress(f"wrote {paths['metrics']}")
    return metrics

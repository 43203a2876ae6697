"""Evaluate estimators on the time-ordered holdout: metrics, by-age metrics, plots, metrics.json.

:func:`run_evaluate` is ``balanceroute evaluate``: it loads saved or registered estimators,
replays the holdout prequentially (each prediction sees only the completions before it) and
writes ``metrics.json`` and the plots. Besides the accuracy of ``p_finish`` and ``c`` it scores
what BR-H's decisions rest on (:mod:`balanceroute.training.decision`: the discounted integrated
Brier score of the curves, Brier and AUC at a few horizons; :mod:`balanceroute.training.
replay_scores`: the error of each worker's projected departures on replayed states, and the
imbalance of the router with the estimator over the router without), and recommends the
estimator to deploy, or ``none`` (:mod:`balanceroute.training.recommend`).
"""

from __future__ import annotations

import copy
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.features.causal import CausalConfig
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.digest import seen_requests
from balanceroute.features.errors import UserError
from balanceroute.features.files import write_text
from balanceroute.features.keys import AUTO_KEY
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME, load_estimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.router.lab.twin.prior import PRIOR_ATTRIBUTE
from balanceroute.training.decision import curve_scores, router_gamma
from balanceroute.training.holdout import Holdout, make_holdout, observe_training_part
from balanceroute.training.metrics import (
    expected_calibration_error,
    reliability,
    score,
    score_by_age,
)
from balanceroute.training.plots import brier_by_age_plot, reliability_plot
from balanceroute.training.prediction_replay import predictions_per_second, replay_predictions
from balanceroute.training.recommend import REFERENCE, Recommendation, recommend
from balanceroute.training.replay_scores import ReplayScoreConfig, replay_scores


@dataclass(frozen=True, slots=True)
class EvaluateConfig:
    """What ``balanceroute evaluate`` scores, on which requests, and where it writes."""

    workload: WorkloadSpec
    out: Path
    model_uri: str | None = None
    kinds: tuple[str, ...] = ()
    model_name: str = DEFAULT_MODEL_NAME
    horizon: int = DEFAULT_HORIZON
    warmup: bool = False
    key: str = AUTO_KEY
    replay: ReplayScoreConfig = field(default_factory=ReplayScoreConfig)


def run_evaluate(cfg: EvaluateConfig) -> tuple[dict[str, dict[str, Any]], Recommendation]:
    """Load the models, replay the holdout, write ``out/metrics.json``, the recommendation
    (``out/recommendation.json``) and plots; returns the estimators' metrics and the
    recommendation."""
    if not cfg.model_uri and not cfg.kinds:
        raise UserError("give --model-uri or --estimator")
    estimators: dict[str, CompletionEstimator] = {}
    if cfg.model_uri:
        est = load_estimator(cfg.model_uri, cfg.model_name)
        estimators[est.name] = est
    for kind in cfg.kinds:
        estimators[kind] = load_estimator(f"models:/{cfg.model_name}@{kind}", cfg.model_name)
    for est in estimators.values():
        own = getattr(est, "key_", None)
        if cfg.key != AUTO_KEY and own is not None and own != cfg.key:
            raise UserError(f"the {est.name} model was trained with key '{own}', not '{cfg.key}'")
    frame, source = load_workload(cfg.workload)
    progress(f"loaded {len(frame):,} requests ({source['kind']}, sha256 {source['sha256'][:12]})")
    holdout = make_holdout(frame, seed=cfg.workload.seed)
    estimators = {kind: unseen_holdout(est, holdout) for kind, est in estimators.items()}
    if cfg.warmup:
        for est in estimators.values():
            observe_training_part(est, holdout, CausalConfig())
    metrics, curves = score_estimators(estimators, holdout, cfg.horizon, cfg.replay)
    rec = recommend(metrics)
    paths = write_report(cfg.out, metrics, curves, rec)
    progress(f"wrote {paths['metrics']}")
    return {kind: m for kind, m in metrics.items() if kind != REFERENCE}, rec


def unseen_holdout(estimator: CompletionEstimator, holdout: Holdout) -> CompletionEstimator:
    """``estimator`` if it never saw the holdout's requests, else a copy of it (same kind and
    parameters, twin prior kept) fitted on the holdout's training part only.

    ``train`` registers models fitted on the whole trace, so evaluating one on the same trace's
    holdout would score it on requests it was fitted on: its boosters trained on them and, worse,
    its feature history already holds their outcomes, and the replay observes them once more.
    A request's own output length then sits in its key's history when it is predicted (on
    Mooncake's prefix-hash keys, a few requests each, that dominates the key's statistics), which
    lifts AUC and breaks calibration (docs/results.md, "Calibration that holds")."""
    seen = seen_requests(getattr(estimator, "fitted_requests_", None), holdout.test)
    if not seen:
        return estimator
    progress(
        f"the {estimator.name} model was fitted on {seen:,} of the holdout's "
        f"{len(holdout.test):,} requests: scoring a copy fitted on the {len(holdout.train):,} "
        "earlier ones with its parameters"
    )
    spec = EstimatorSpec(estimator.name, params=estimator.params())
    honest = build_estimator(spec, history=holdout.train)
    if hasattr(estimator, PRIOR_ATTRIBUTE):
        setattr(honest, PRIOR_ATTRIBUTE, getattr(estimator, PRIOR_ATTRIBUTE))
    return honest


def score_estimators(
    estimators: dict[str, CompletionEstimator],
    holdout: Holdout,
    horizon: int,
    replay: ReplayScoreConfig | None = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, list[float]]]]:
    """Every metric of each estimator and of the prediction-free reference ``none``: the
    prequential scores, the decision-aware scores and the replay scores (measured first, on
    copies, so no estimator has seen the holdout before the replays)."""
    replay = replay or ReplayScoreConfig()
    gamma = router_gamma(holdout.arrays.output_tokens[: holdout.first_test], replay.slots)
    every = {**estimators, REFERENCE: NoPrediction(horizon=horizon).fit()}
    progress(f"replaying the holdout under brh with each estimator (gamma {gamma:.3f})")
    replayed = replay_scores(every, holdout.test, gamma, horizon, replay)
    metrics: dict[str, dict[str, Any]] = {}
    curves: dict[str, dict[str, list[float]]] = {}
    for kind, est in every.items():
        progress(f"evaluating {kind} on {holdout.index.size:,} snapshots")
        metrics[kind], curves[kind] = evaluate_estimator(est, holdout, horizon, gamma)
        metrics[kind].update(replayed[kind])
        m = metrics[kind]
        progress(
            f"{kind}: brier {m['brier']:.4f} auc {m['auc']:.4f} ece {m['ece']:.4f} "
            f"ece_at_risk {m['ece_at_risk']:.4f} ibs_discounted {m['ibs_discounted']:.4f} proj_error_margin "
            f"{m['proj_error_margin']:.4f} replay_ratio {m['replay_ratio']:.3f}"
        )
    return metrics, curves


@dataclass(frozen=True)
class Scored:
    """One estimator scored on a holdout: its metrics, reliability curve and ``p_finish`` at
    each of the holdout's snapshots (a paired comparison of two estimators reads them)."""

    metrics: dict[str, Any]
    curve: dict[str, list[float]]
    p_finish: np.ndarray


def evaluate_estimator(
    estimator: CompletionEstimator, holdout: Holdout, horizon: int, gamma: float | None = None
) -> tuple[dict[str, Any], dict[str, list[float]]]:
    """Metrics and reliability curve of one estimator (:func:`score_holdout`)."""
    scored = score_holdout(estimator, holdout, horizon, gamma)
    return scored.metrics, scored.curve


def score_holdout(
    estimator: CompletionEstimator, holdout: Holdout, horizon: int, gamma: float | None = None
) -> Scored:
    """Metrics (with ``by_age``, ``predictions_per_s``, ``brier_at_admission`` and the curve
    scores at discount ``gamma``, by default BR-H's for the training part at the default
    ``B``), reliability curve and snapshot predictions of one estimator."""
    if gamma is None:
        gamma = router_gamma(holdout.arrays.output_tokens[: holdout.first_test])
    fresh = copy.deepcopy(estimator)  # the replay teaches the estimator: one copy per replay
    res = replay_predictions(
        estimator, holdout.arrays, holdout.first_test, holdout.index, holdout.age, survival=True
    )
    r = holdout.remaining
    metrics: dict[str, Any] = score(res.p_finish, res.c, r, horizon)
    metrics["brier_at_admission"] = brier_at_admission(fresh, holdout, horizon)
    at_risk = holdout.arrays.output_tokens[holdout.index]  # time at risk of each snapshot
    metrics.update(curve_scores(res.survival, r, gamma, horizon, at_risk))
    metrics.update(at_risk_scores(res.p_finish, r, horizon, at_risk))
    metrics["predictions_per_s"] = predictions_per_second(
        estimator, holdout.arrays, holdout.index, holdout.age
    )
    metrics["replay_steps"] = res.steps
    metrics["by_age"] = score_by_age(res.p_finish, res.c, r, holdout.age, horizon)
    y = (r <= horizon).astype(np.float64)
    return Scored(metrics, reliability(res.p_finish, y), res.p_finish)


def brier_at_admission(estimator: CompletionEstimator, holdout: Holdout, horizon: int) -> float:
    """The Brier score of ``p_finish`` for each holdout request at admission (age 0), in its
    own replay (the snapshots' replay is left as it was): what the live drift gauge compares."""
    admitted = np.arange(holdout.first_test, holdout.arrays.size)
    res = replay_predictions(estimator, holdout.arrays, holdout.first_test, admitted, 0 * admitted)
    return score(res.p_finish, res.c, holdout.arrays.output_tokens[admitted], horizon)["brier"]


def at_risk_scores(
    p: np.ndarray, remaining: np.ndarray, horizon: int, at_risk: np.ndarray
) -> dict[str, float]:
    """Brier and calibration error of ``p_finish`` with each snapshot weighted by its request's
    length: the holdout's snapshots sit at uniform ages of each request, so these weights make
    them the running requests a router meets (what a model weighted by time at risk is
    calibrated for; ``ece`` and ``brier`` weigh every request alike)."""
    y = (remaining <= horizon).astype(np.float64)
    w = np.asarray(at_risk, dtype=np.float64)
    return {
        "brier_at_risk": float(np.average((p - y) ** 2, weights=w)),
        "ece_at_risk": expected_calibration_error(p, y, weight=w),
    }


def write_report(
    out_dir: Path,
    metrics: dict[str, dict[str, Any]],
    curves: dict[str, dict[str, list[float]]],
    recommendation: Recommendation | None = None,
) -> dict[str, Path]:
    """metrics.json (the estimators'; the reference ``none`` goes with the recommendation),
    recommendation.json and the two plots in ``out_dir``; returns their paths."""
    shown = {k: m for k, m in metrics.items() if k != REFERENCE}
    paths = {"metrics": out_dir / "metrics.json"}
    write_text(paths["metrics"], json.dumps(shown, indent=2, sort_keys=True) + "\n")
    if recommendation is not None:
        paths["recommendation"] = out_dir / "recommendation.json"
        body = json.dumps(recommendation.as_dict(), indent=2, sort_keys=True) + "\n"
        write_text(paths["recommendation"], body)
    paths["reliability"] = reliability_plot(
        {k: c for k, c in curves.items() if k != REFERENCE}, out_dir / "reliability.png"
    )
    by_age = {k: m["by_age"] for k, m in shown.items()}
    paths["brier_by_age"] = brier_by_age_plot(by_age, out_dir / "brier_by_age.png")
    return paths


def _cell(value: Any) -> str:
    """One table cell: integers with separators, floats to four significant decimals."""
    if isinstance(value, bool) or not isinstance(value, int | float | np.integer | np.floating):
        return str(value)
    if isinstance(value, int | np.integer):
        return f"{int(value):,}"
    if not np.isfinite(value):
        return "n/a"
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def metrics_table(metrics: dict[str, dict[str, Any]]) -> str:
    """The metrics as a text table: one row per scalar metric (every key any estimator reports,
    in first-seen order), one column per estimator; nested ones such as ``by_age`` stay in
    metrics.json."""
    names: list[str] = []
    for m in metrics.values():
        names += [k for k, v in m.items() if not isinstance(v, dict | list) and k not in names]
    rows = [["metric", *metrics]]
    rows += [[name, *(_cell(m.get(name, "")) for m in metrics.values())] for name in names]
    widths = [max(len(r[j]) for r in rows) for j in range(len(rows[0]))]
    lines = [
        "  ".join(
            c.ljust(w) if j == 0 else c.rjust(w)
            for j, (c, w) in enumerate(zip(r, widths, strict=True))
        )
        for r in rows
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def progress(message: str) -> None:
    """One progress line on stderr, its UTC time first."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    print(f"{stamp} [balanceroute] {message}", file=sys.stderr, flush=True)


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

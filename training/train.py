"""``balanceroute train``: fit estimators on the earlier 70%, score them on the rest, register
them fitted on all of it, with the twin's cross-fitted prior, and track them.

Order of work, so that nothing trained is ever lost: fit and evaluate every estimator, write the
joblib files, metrics and plots to a local folder, score the current ``champion`` on this run's
holdout, and only then log to MLflow in one final step (params, metrics, artifacts, one pyfunc
model per estimator registered as a version of one registered model, with a ``kind`` tag). If
tracking fails the run is marked FAILED and the error says where the local artifacts are.

Promotion: the aliases move only once the run has finished successfully, in one short step
after it (a failed or interrupted run moves none). Each kind's alias names this run's version of
that kind. ``champion`` moves to the run's best estimator (lowest validation Brier) only if it
beats the current champion scored on the *same* holdout, or with ``promote``; otherwise the
candidate becomes ``challenger``. A run killed outright (``kill -9``) cannot close itself: the
next ``train`` marks such orphans (RUNNING, started by a process that no longer exists on this
host) as KILLED.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import os
import socket
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.features.files import write_text
from balanceroute.features.keys import AUTO_KEY, check_key_source, resolve_key_source
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.base import CompletionEstimator, Fitting
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.live_quality import HOLDOUT_BRIER_TAG
from balanceroute.predict.model_store import (
    DEFAULT_MODEL_NAME,
    error_line,
    load_file,
    save_estimator,
    setup_mlflow,
    tracking_uri,
)
from balanceroute.predict.registry import estimator_class, estimator_names
from balanceroute.router.lab.twin.prior import PriorConfig, TwinPrior, attach_priors
from balanceroute.router.lab.twin.prior_measure import priors_for
from balanceroute.training.champion import Paired, move_aliases, score_champion
from balanceroute.training.crossfit import DEFAULT_PRIOR_FOLDS, fitted_folds, time_folds
from balanceroute.training.evaluate import (
    flat_metrics,
    progress,
    score_holdout,
    write_report,
)
from balanceroute.training.holdout import Holdout, make_holdout
from balanceroute.training.pyfunc import PIP_REQUIREMENTS, CompletionPyfunc, signature
from balanceroute.training.tracking import (
    DEFAULT_ESTIMATORS,
    DEFAULT_EXPERIMENT,
    TrackingError,
)


@dataclass(frozen=True, slots=True)
class TrainConfig:
    """Everything ``train`` needs; written as config.json next to the artifacts."""

    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    horizon: int = DEFAULT_HORIZON
    estimators: tuple[str, ...] = DEFAULT_ESTIMATORS
    key: str = AUTO_KEY
    experiment: str = DEFAULT_EXPERIMENT
    register_as: str = DEFAULT_MODEL_NAME
    out: str | None = None
    promote: bool = False
    weighting: str | None = None  # the learned estimators' row weighting (None: their default)
    train_fraction: float = 0.7
    estimator_params: dict[str, dict[str, Any]] = field(default_factory=dict)
    # the twin's paired test on the holdout, one prior per group (router/lab/twin/prior_measure.py);
    # empty: none
    twin_priors: tuple[PriorConfig, ...] = (PriorConfig(),)
    # cross-fitted folds of the whole trace the priors pool (training/crossfit.py); 1: the
    # holdout only, replayed by the copy fitted on the training part
    prior_folds: int = DEFAULT_PRIOR_FOLDS


def trainable_estimators() -> list[str]:
    """Kinds ``train`` fits: deployable estimators that learn from history."""
    return [
        n for n in estimator_names(deployable=True) if estimator_class(n).fitting is Fitting.HISTORY
    ]


def check_estimators(kinds: tuple[str, ...]) -> tuple[str, ...]:
    """Refuse unknown or non-deployable estimator names before any work starts."""
    known = trainable_estimators()
    bad = [k for k in kinds if k not in known]
    if bad or not kinds:
        raise UserError(
            f"unknown estimator(s) {bad or kinds}; trainable estimators: {', '.join(known)}"
        )
    return kinds


def estimator_spec(cfg: TrainConfig, kind: str) -> EstimatorSpec:
    """The spec of one kind: the run's horizon, its key source and row weighting where it has
    them, overrides."""
    names = {f.name for f in dataclasses.fields(estimator_class(kind).Params)}
    params: dict[str, Any] = {"horizon": cfg.horizon}
    if "key" in names:
        params["key"] = cfg.key
    if "weighting" in names and cfg.weighting is not None:
        params["weighting"] = cfg.weighting
    return EstimatorSpec(kind, params={**params, **cfg.estimator_params.get(kind, {})})


def run_name() -> str:
    return time.strftime("train-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


def check_config(cfg: TrainConfig) -> tuple[str, ...]:
    """Refuse a configuration ``train`` cannot run, before any input is read; returns the kinds."""
    kinds = check_estimators(cfg.estimators)
    if cfg.key != AUTO_KEY:
        check_key_source(cfg.key)
    if cfg.horizon < 1:
        raise UserError(f"horizon must be at least 1, got {cfg.horizon}")
    return kinds


@dataclass
class Trained:
    """One run's estimators, fitted, scored on the holdout and saved locally (no MLflow yet)."""

    name: str
    out_dir: Path
    holdout: Holdout
    history: pd.DataFrame  # the whole input in arrival order: what the saved models fitted
    key: str
    metrics: dict[str, dict[str, Any]]
    curves: dict[str, dict[str, list[float]]]
    files: dict[str, Path]
    params: dict[str, dict[str, Any]]
    heads: dict[str, CompletionEstimator]  # as fitted on the training part, before evaluation
    priors: dict[str, list[TwinPrior]] = field(default_factory=dict)
    predictions: dict[str, np.ndarray] = field(default_factory=dict)  # at the holdout's snapshots

    def paired(self, horizon: int) -> Paired:
        """The candidates' predictions, for the champion's paired comparison."""
        return Paired(self.predictions, self.holdout, horizon)


def fit_candidates(cfg: TrainConfig, frame: pd.DataFrame) -> Trained:
    """Fit every kind on the earlier ``train_fraction`` of ``frame``, score it on the rest,
    then fit it on all of ``frame`` and save that model locally."""
    kinds = check_config(cfg)
    holdout = make_holdout(frame, cfg.train_fraction, cfg.workload.seed)
    key = resolve_key_source(cfg.key, bool(frame["prompt_key"].notna().any()))
    name = run_name()
    out_dir = Path(cfg.out) if cfg.out else Path("artifacts") / "models" / name
    out_dir.mkdir(parents=True, exist_ok=True)
    history = frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    done = Trained(name, out_dir, holdout, history, key, {}, {}, {}, {}, {})
    for kind in kinds:
        t0 = time.perf_counter()
        progress(f"fitting {kind} on {len(holdout.train):,} requests (scored on the holdout)")
        est = build_estimator(estimator_spec(cfg, kind), history=holdout.train)
        fit_s = time.perf_counter() - t0
        done.heads[kind] = copy.deepcopy(est)
        done.params[kind] = est.params()
        progress(f"evaluating {kind} on {holdout.index.size:,} snapshots")
        scored = score_holdout(est, holdout, cfg.horizon)
        m, done.curves[kind], done.predictions[kind] = scored.metrics, scored.curve, scored.p_finish
        m["fit_seconds"] = fit_s
        m.update(getattr(est, "calibration_report_", {}))
        done.metrics[kind] = m
        progress(
            f"{kind}: brier {m['brier']:.4f} auc {m['auc']:.4f} "
            f"ece {m['ece']:.4f} ({fit_s:.1f}s fit)"
        )
        progress(f"fitting {kind} on all {len(history):,} requests (the model registered)")
        full = build_estimator(estimator_spec(cfg, kind), history=history)
        full.holdout_brier_ = float(m["brier_at_admission"])  # the live drift gauge's reference
        done.files[kind] = save_estimator(full, out_dir / f"{kind}.joblib")
    return done


def save_local(
    cfg: TrainConfig, done: Trained, source: dict[str, Any]
) -> tuple[dict[str, Any], dict[str, Path]]:
    """The report (metrics, plots) and ``config.json`` (the run's summary) in the run's local
    folder; returns the summary and the report's paths."""
    report = write_report(done.out_dir, done.metrics, done.curves)
    holdout = done.holdout
    summary: dict[str, Any] = {
        "run_name": done.name,
        "local_dir": str(done.out_dir.resolve()),
        "key": done.key,
        "n_train": holdout.first_test,
        "n_registered": len(done.history),
        "n_test": holdout.arrays.size - holdout.first_test,
        "source": source,
        "config": asdict(cfg),
        "estimator_params": done.params,
        "metrics": {
            k: {m: v for m, v in d.items() if m != "by_age"} for k, d in done.metrics.items()
        },
        "twin_priors": {k: [p.as_dict() for p in ps] for k, ps in done.priors.items()},
    }
    write_text(done.out_dir / "config.json", json.dumps(summary, indent=2, default=str) + "\n")
    progress(f"artifacts saved locally in {done.out_dir.resolve()}")
    return summary, report


def run_train(cfg: TrainConfig) -> dict[str, Any]:
    """Train, evaluate, save locally, then log and register in MLflow; returns a summary."""
    check_config(cfg)
    frame, source = load_workload(cfg.workload)
    progress(f"loaded {len(frame):,} requests ({source['kind']}, sha256 {source['sha256'][:12]})")
    done = fit_candidates(cfg, frame)
    done.priors = twin_priors(cfg, done.files, done.holdout, done.history, done.heads)
    summary, report = save_local(cfg, done, source)
    try:
        champion = score_champion(cfg, done.holdout)
        summary["registry"] = log_to_mlflow(
            cfg, summary, done.files, report, done.metrics, done.out_dir, done.priors
        )
        versions = summary["registry"]["versions"]
        paired = done.paired(cfg.horizon)
        summary["registry"].update(move_aliases(cfg, versions, done.metrics, champion, paired))
    except TrackingError:
        raise
    except Exception as exc:
        raise tracking_failed(exc, done.out_dir) from None
    return summary


def tracking_failed(exc: BaseException, out_dir: Path) -> TrackingError:
    """The error a failed MLflow step raises: what failed, and where the local artifacts are."""
    return TrackingError(
        f"tracking store {tracking_uri()} failed ({error_line(exc)}); the trained artifacts "
        f"are saved locally in {out_dir.resolve()}"
    )


def twin_priors(
    cfg: TrainConfig,
    files: dict[str, Path],
    holdout: Holdout,
    history: pd.DataFrame,
    heads: dict[str, CompletionEstimator] | None = None,
) -> dict[str, list[TwinPrior]]:
    """The twin's prior of every saved model, kept in its file (re-saved).

    Cross-fitted (``cfg.prior_folds`` >= 2): every fold of the whole ``history`` is replayed by
    a copy fitted on the other folds, and the prior pools them; the saved model (fitted on all
    of it) is not what replays. One fold: the holdout, replayed by a copy fitted on the training
    part."""
    if not cfg.twin_priors or holdout.test is None:
        return {}
    if cfg.prior_folds == 1:
        folds = [(holdout.train, holdout.test)]
    else:
        folds = time_folds(history, cfg.prior_folds)
    heads = heads or {}
    pairs = {}
    for kind in files:
        spec = estimator_spec(cfg, kind)
        head = heads.get(kind)

        def fit(part: pd.DataFrame, spec=spec, head=head) -> CompletionEstimator:
            if head is not None and part["request_id"].equals(holdout.train["request_id"]):
                return copy.deepcopy(head)
            return build_estimator(spec, history=part)

        progress(f"fitting {kind} for the twin's prior: {len(folds)} fold(s)")
        pairs[kind] = fitted_folds(fit, folds)
    priors = priors_for(pairs, list(cfg.twin_priors), progress=progress)
    for kind, path in files.items():
        est = load_file(path)
        attach_priors(est, priors[kind])
        save_estimator(est, path)
    return priors


def prior_metrics(priors: dict[str, list[TwinPrior]]) -> dict[str, float]:
    """``kind.twin_prior.<G>x<B>.weight`` and the mean log ratio of every candidate, for MLflow."""
    flat: dict[str, float] = {}
    for kind, ps in priors.items():
        for p in ps:
            base = f"{kind}.twin_prior.{p.workers}x{p.slots}"
            flat[f"{base}.weight"] = p.start_weight
            flat[f"{base}.windows"] = float(p.windows)
            for c, m, u in zip(p.candidates, p.mean_log_ratio, p.upper, strict=True):
                if c != 0.0 and np.isfinite(u):
                    flat[f"{base}.w{c:g}.mean_log_ratio"] = m
                    flat[f"{base}.w{c:g}.upper"] = u
    return flat


def _params(cfg: TrainConfig, summary: dict[str, Any]) -> dict[str, Any]:
    src = summary["source"]
    flat = {
        "horizon": cfg.horizon,
        "estimators": ",".join(cfg.estimators),
        "key": summary["key"],
        "train_fraction": cfg.train_fraction,
        "n_train": summary["n_train"],
        "n_test": summary["n_test"],
        "seed": cfg.workload.seed,
        "source_kind": src["kind"],
        "source": src.get("path") or src.get("preset"),
        "trace_sha256": src["sha256"],
        "trace_rows": src["rows"],
    }
    for kind, p in summary["estimator_params"].items():
        flat.update({f"{kind}.{k}": v for k, v in p.items()})
    return flat


PID_TAG, HOST_TAG = "balanceroute.pid", "balanceroute.host"


def version_tags(
    kind: str, metrics: dict[str, Any], priors: list[TwinPrior], lineage: dict[str, str]
) -> dict[str, str]:
    """A registered version's tags: its kind, its holdout Brier (rounded, ``val_brier``), its
    holdout Brier at admission (:data:`HOLDOUT_BRIER_TAG`: what the live drift gauge divides
    by), its twin priors and the lineage of its input."""
    tags = {
        "kind": kind,
        "val_brier": f"{metrics['brier']:.5f}",
        HOLDOUT_BRIER_TAG: repr(float(metrics["brier_at_admission"])),
    }
    for prior in priors:
        tags.update(prior.tags())
    return {**tags, **lineage}


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def close_orphaned_runs(client: Any, experiment: str) -> list[str]:
    """Mark KILLED the RUNNING runs of ``experiment`` whose training process, on this host, is
    gone (a ``kill -9`` leaves them RUNNING forever); returns their ids."""
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        return []
    closed = []
    host = socket.gethostname()
    for run in client.search_runs([exp.experiment_id], "attributes.status = 'RUNNING'"):
        tags = run.data.tags
        pid = tags.get(PID_TAG, "")
        if tags.get(HOST_TAG) == host and pid.isdigit() and not _alive(int(pid)):
            client.set_terminated(run.info.run_id, status="KILLED")
            closed.append(run.info.run_id)
            progress(f"closed run {run.info.run_id}: its process {pid} is gone (marked KILLED)")
    return closed


def log_to_mlflow(
    cfg: TrainConfig,
    summary: dict[str, Any],
    files: dict[str, Path],
    report: dict[str, Path],
    metrics: dict[str, dict[str, Any]],
    out_dir: Path,
    priors: dict[str, list[TwinPrior]] | None = None,
    lineage: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Log the run and register one model version per estimator (with its twin priors as an
    artifact, metrics and version tags; ``lineage`` as tags of the run and of every version);
    returns versions and aliases."""
    priors = priors or {}
    lineage = lineage or {}
    uri = setup_mlflow(cfg.experiment)
    import mlflow
    from mlflow import MlflowClient

    progress(f"logging to MLflow at {uri}")
    client = MlflowClient()
    versions: dict[str, str] = {}
    close_orphaned_runs(client, cfg.experiment)
    with mlflow.start_run(run_name=summary["run_name"]) as run:
        mlflow.log_params(_params(cfg, summary))
        mlflow.set_tags(
            {
                "trace_sha256": summary["source"]["sha256"],
                "trace_rows": summary["source"]["rows"],
                PID_TAG: str(os.getpid()),
                HOST_TAG: socket.gethostname(),
                **lineage,
            }
        )
        mlflow.log_metrics({**flat_metrics(metrics), **prior_metrics(priors)})
        for kind, ps in priors.items():
            mlflow.log_dict([p.as_dict() for p in ps], f"twin_prior/{kind}.json")
        mlflow.log_dict(summary["source"], "trace.json")
        for path in report.values():
            mlflow.log_artifact(str(path), artifact_path="evaluation")
        mlflow.log_artifact(str(out_dir / "config.json"))
        for kind, path in files.items():
            info = mlflow.pyfunc.log_model(
                name=kind,
                python_model=CompletionPyfunc(),
                artifacts={"estimator": str(path)},
                signature=signature(),
                pip_requirements=PIP_REQUIREMENTS,
                registered_model_name=cfg.register_as,
            )
            version = str(info.registered_model_version)
            tags = version_tags(kind, metrics[kind], priors.get(kind, []), lineage)
            for tag, value in tags.items():
                client.set_model_version_tag(cfg.register_as, version, tag, value)
            versions[kind] = version
            progress(f"registered {cfg.register_as} version {version} ({kind})")
    return {
        "tracking_uri": uri,
        "run_id": run.info.run_id,
        "model": cfg.register_as,
        "versions": versions,
        "brier": {k: float(np.round(metrics[k]["brier"], 6)) for k in versions},
    }

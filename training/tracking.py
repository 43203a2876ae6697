"""MLflow tracking: the defaults of ``train``, the error a tracking outage raises, and the one
shape of an experiment's record (a parent run with a child run per arm).

Where runs go (``MLFLOW_TRACKING_URI``, else SQLite in the working folder) is set up by
:func:`balanceroute.predict.model_store.setup_mlflow`, which reading a model needs too.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import setup_mlflow

DEFAULT_EXPERIMENT = "completion-predictors"
DEFAULT_ESTIMATORS = ("survival", "exactmatch", "gbdt")


class TrackingError(UserError):
    """The tracking store could not be reached or refused a write; local artifacts are kept."""

    exit_code = 3


@dataclass(frozen=True, slots=True)
class ChildRun:
    """One arm's nested run: its name, parameters, tags and metrics."""

    name: str
    params: dict[str, Any]
    metrics: dict[str, float]
    tags: dict[str, str] = field(default_factory=dict)


def log_parent_with_children(
    experiment: str,
    run_name: str,
    params: dict[str, Any],
    children: Iterable[ChildRun],
    *,
    tags: dict[str, str] | None = None,
    artifacts: Iterable[tuple[Path, str | None]] = (),
) -> str:
    """One parent run in ``experiment`` (parameters, tags, artifacts as (file, folder or
    None)) with a nested child run per arm, in the order given; returns the parent's id."""
    setup_mlflow(experiment)
    import mlflow

    with mlflow.start_run(run_name=run_name) as parent:
        mlflow.log_params(params)
        for key, value in (tags or {}).items():
            mlflow.set_tag(key, value)
        for path, folder in artifacts:
            mlflow.log_artifact(str(path), artifact_path=folder)
        for child in children:
            with mlflow.start_run(run_name=child.name, nested=True):
                mlflow.log_params(child.params)
                for key, value in child.tags.items():
                    mlflow.set_tag(key, value)
                mlflow.log_metrics({k: float(v) for k, v in child.metrics.items()})
        return parent.info.run_id

"""MLflow setup: where runs go, telemetry off, fast failure when a tracking server is down."""

from __future__ import annotations

import os
from pathlib import Path

from balanceroute.features.errors import UserError

DEFAULT_MODEL_NAME = "completion-predictor"
DEFAULT_EXPERIMENT = "completion-predictors"
DEFAULT_ESTIMATORS = ("survival", "exactmatch", "gbdt")


class TrackingError(UserError):
    """The tracking store could not be reached or refused a write; local artifacts are kept."""

    exit_code = 3


def tracking_uri() -> str:
    """``MLFLOW_TRACKING_URI`` if set, else a SQLite store in the working folder."""
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


def setup_mlflow(experiment: str | None = None) -> str:
    """Point MLflow at :func:`tracking_uri` (and the experiment); returns the URI used."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    import mlflow

    quiet_mlflow()

    uri = tracking_uri()
    mlflow.set_tracking_uri(uri)
    if experiment is not None:
        mlflow.set_experiment(experiment)
    return uri


def quiet_mlflow() -> None:
    """Keep MLflow's own chatter (table migrations, pickling advice) out of the CLI's output:
    the commands say what they log and register themselves."""
    import logging
    import warnings

    logging.getLogger("mlflow").setLevel(logging.WARNING)
    logging.getLogger("alembic").setLevel(logging.WARNING)
    warnings.filterwarnings("ignore", message=".*Passing a Python object as `python_model`.*")
    warnings.filterwarnings("ignore", message=".*An input example was not provided.*")
    logging.getLogger("mlflow.pyfunc").setLevel(logging.ERROR)

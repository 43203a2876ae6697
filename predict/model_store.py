"""Where fitted estimators live: joblib files and the MLflow model registry.

- :func:`save_estimator` writes a joblib file atomically; :func:`load_file` reads one, from this
  release or from release 0.1.0, whose pickles name the modules before they moved under the
  ``balanceroute`` namespace (:data:`LEGACY_MODULES` maps them);
- :func:`load_estimator` resolves any reference a user may give: a ``.joblib`` path, an MLflow
  URI (``models:/NAME@ALIAS``, ``models:/NAME/VERSION``, ``runs:/RUN/KIND``) or a bare alias
  (``champion``, ``gbdt``) of the default registered model. A registered version is read by
  downloading its artifacts and loading the estimator file they hold, so loading never unpickles
  MLflow's pyfunc wrapper;
- :func:`setup_mlflow` points MLflow at ``MLFLOW_TRACKING_URI`` or, by default, a SQLite store in
  the working folder, with telemetry off and MLflow's own chatter kept out of the CLI's output.

MLflow is imported lazily (it costs seconds to import and weighs on a process for good): a
process that only scores saved models never imports it.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import tempfile
import threading
import types
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import joblib

from balanceroute.features.errors import UserError
from balanceroute.features.files import atomic_output
from balanceroute.predict.base import CompletionEstimator

DEFAULT_MODEL_NAME = "completion-predictor"
ESTIMATOR_ARTIFACT = "estimator"

# Modules named by the pickles of release 0.1.0 -> the modules holding those names now.
LEGACY_MODULES: dict[str, tuple[str, ...]] = {
    "predict.base": ("balanceroute.predict.base",),
    "predict.calibration": ("balanceroute.predict.calibration",),
    "predict.empirical": ("balanceroute.features.windows",),
    "predict.exactmatch": ("balanceroute.predict.exactmatch",),
    "predict.gbdt": ("balanceroute.predict.gbdt", "balanceroute.predict.forest"),
    "predict.keys": ("balanceroute.features.keys",),
    "predict.no_prediction": ("balanceroute.predict.no_prediction",),
    "predict.noisy_oracle": ("balanceroute.predict.noisy_oracle",),
    "predict.oracle": ("balanceroute.predict.oracle",),
    "predict.survival": ("balanceroute.predict.survival",),
    "features.causal": ("balanceroute.features.causal",),
    "features.schema": ("balanceroute.features.schema",),
}
_LEGACY_LOCK = threading.Lock()


@contextlib.contextmanager
def _legacy_module_names() -> Iterator[None]:
    """While unpickling, let the old module names resolve to the modules that hold them now."""
    with _LEGACY_LOCK:
        added: list[str] = []
        for old, new in LEGACY_MODULES.items():
            parent = old.split(".")[0]
            if parent not in sys.modules:
                package = types.ModuleType(parent)
                package.__path__ = []
                sys.modules[parent] = package
                added.append(parent)
            if old in sys.modules:
                continue
            alias = types.ModuleType(old)
            for name in reversed(new):
                alias.__dict__.update(vars(importlib.import_module(name)))
            sys.modules[old] = alias
            added.append(old)
        try:
            yield
        finally:
            for name in added:
                sys.modules.pop(name, None)


def save_estimator(estimator: CompletionEstimator, path: str | Path) -> Path:
    """Write ``estimator`` to ``path`` with joblib: a temporary file, then a rename."""
    path = Path(path)
    with atomic_output(path) as tmp, tmp.open("wb") as fh:
        joblib.dump(estimator, fh)
    return path


def load_file(
    source: str | Path | bytes | BinaryIO, *, name: str | None = None
) -> CompletionEstimator:
    """The estimator saved in a joblib file (a path, its bytes or an open file); a UserError
    naming the file if it holds anything else or cannot be read."""
    where = name or (str(source) if isinstance(source, str | Path) else "the model file")
    if isinstance(source, bytes):
        source = io.BytesIO(source)
    try:
        with _legacy_module_names():
            obj = joblib.load(source)
    except FileNotFoundError:
        raise UserError(f"model file not found: {where}") from None
    except Exception:
        raise UserError(
            f"{where} is not a saved completion estimator (a joblib file written by "
            "balanceroute train or save_estimator)"
        ) from None
    if not isinstance(obj, CompletionEstimator):
        raise UserError(f"{where} does not hold a completion estimator (got {type(obj).__name__})")
    return obj


def error_line(error: BaseException | str) -> str:
    """The line of an error message that says what went wrong: the first one, skipping
    SQLAlchemy's "Background on this error" link and SQL echoes (a corrupt or foreign
    registry database otherwise shows only those)."""
    text = str(error)
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith(("(Background on this error", "[SQL:", "[parameters:")):
            return line[:300]
    return type(error).__name__ if isinstance(error, BaseException) else "unknown error"


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


def model_uri(ref: str, model_name: str = DEFAULT_MODEL_NAME) -> str:
    """The MLflow URI a reference stands for (bare aliases go to ``model_name``)."""
    if "://" in ref or ref.startswith(("models:", "runs:")):
        return ref
    return f"models:/{model_name}@{ref}"


def is_file_reference(ref: str) -> bool:
    """Whether ``ref`` names a local file rather than a registry entry."""
    return ref.endswith(".joblib") or Path(ref).is_file()


def load_estimator(ref: str, model_name: str = DEFAULT_MODEL_NAME) -> CompletionEstimator:
    """Load the estimator behind a path, URI or alias; a UserError if it does not resolve."""
    if is_file_reference(ref):
        return load_file(ref)
    setup_mlflow()
    import mlflow.artifacts

    uri = model_uri(ref, model_name)
    with tempfile.TemporaryDirectory(prefix="balanceroute-model-") as tmp:
        try:
            local = Path(mlflow.artifacts.download_artifacts(artifact_uri=uri, dst_path=tmp))
        except Exception as exc:
            msg = error_line(exc)
            raise UserError(f"model URI '{uri}' does not resolve: {msg}") from None
        return load_file(_estimator_file(local, uri), name=uri)


def _estimator_file(model_dir: Path, uri: str) -> Path:
    """The estimator's joblib file inside a downloaded pyfunc model directory."""
    import yaml

    spec = model_dir / "MLmodel"
    if spec.is_file():
        meta = yaml.safe_load(spec.read_text()) or {}
        pyfunc = (meta.get("flavors") or {}).get("python_function") or {}
        entry = (pyfunc.get("artifacts") or {}).get(ESTIMATOR_ARTIFACT) or {}
        if entry.get("path") and (model_dir / entry["path"]).is_file():
            return model_dir / entry["path"]
    found = sorted(model_dir.rglob("*.joblib"))
    if len(found) != 1:
        raise UserError(f"model URI '{uri}' is not a completion-predictor model")
    return found[0]


def registered_version(uri: str) -> str | None:
    """The registry version an alias or version URI names, when it can be looked up."""
    full = model_uri(uri)
    if not full.startswith("models:/"):
        return None
    rest = full[len("models:/") :]
    if "@" not in rest:
        return rest.rsplit("/", 1)[-1]
    try:
        setup_mlflow()
        from mlflow import MlflowClient

        name, alias = rest.split("@", 1)
        return str(MlflowClient().get_model_version_by_alias(name, alias).version)
    except Exception:
        return None

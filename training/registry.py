"""Resolve a model reference to the native vectorized estimator.

Accepted: a local ``.joblib`` path, any MLflow model URI (``models:/name@alias``,
``models:/name/3``, ``runs:/<id>/<kind>``), or a bare alias or kind (``champion``, ``gbdt``),
read as ``models:/completion-predictor@<alias>``.
"""

from __future__ import annotations

from pathlib import Path

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.training.tracking import DEFAULT_MODEL_NAME, setup_mlflow


def model_uri(ref: str, model_name: str = DEFAULT_MODEL_NAME) -> str:
    """The MLflow URI a reference stands for (bare aliases go to ``model_name``)."""
    if "://" in ref or ref.startswith(("models:", "runs:")):
        return ref
    return f"models:/{model_name}@{ref}"


def load_estimator(ref: str, model_name: str = DEFAULT_MODEL_NAME) -> CompletionEstimator:
    """Load the estimator behind a path, URI or alias; a UserError if it does not resolve."""
    path = Path(ref)
    if ref.endswith(".joblib") or path.is_file():
        if not path.is_file():
            raise UserError(f"model file not found: {ref}")
        try:
            return CompletionEstimator.load(path)
        except Exception as exc:
            raise UserError(f"cannot load an estimator from {ref}: {exc}") from None
    setup_mlflow()
    import mlflow.pyfunc

    uri = model_uri(ref, model_name)
    try:
        model = mlflow.pyfunc.load_model(uri)
    except Exception as exc:
        msg = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise UserError(f"model URI '{uri}' does not resolve: {msg}") from None
    wrapped = model.unwrap_python_model()
    estimator = getattr(wrapped, "estimator", None)
    if not isinstance(estimator, CompletionEstimator):
        raise UserError(f"model URI '{uri}' is not a completion-predictor pyfunc")
    return estimator

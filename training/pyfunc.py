"""The MLflow model: a pyfunc wrapping a joblib-saved completion estimator.

Input frame columns ``prompt_tokens``, ``age`` and optionally ``prompt_key`` (strings are hashed
like the trace loaders do; integers are taken as already-hashed uint64 keys); output columns
``p_finish`` and ``c``. :func:`balanceroute.predict.model_store.load_estimator` reads the estimator file it holds.
"""

from __future__ import annotations

from typing import Any

import mlflow.pyfunc
import numpy as np
import pandas as pd

from balanceroute.features.schema import hash_keys
from balanceroute.predict.base import RunningBatch
from balanceroute.predict.model_store import ESTIMATOR_ARTIFACT, load_file

PIP_REQUIREMENTS = ["mlflow", "lightgbm", "scikit-learn", "pandas", "numpy", "joblib", "scipy"]


def frame_to_batch(frame: pd.DataFrame) -> RunningBatch:
    """A RunningBatch from a pyfunc input frame."""
    keys = None
    if "prompt_key" in frame.columns:
        col = frame["prompt_key"]
        if pd.api.types.is_integer_dtype(col):
            keys = col.to_numpy().astype(np.uint64)
        else:
            keys = hash_keys(col)
    return RunningBatch(
        prompt_tokens=frame["prompt_tokens"].to_numpy(dtype=np.int64),
        age=frame["age"].to_numpy(dtype=np.int64),
        prompt_key=keys,
    )


class CompletionPyfunc(mlflow.pyfunc.PythonModel):
    """pyfunc adapter: DataFrame in, DataFrame (p_finish, c) out."""

    def load_context(self, context: Any) -> None:
        self.estimator = load_file(context.artifacts[ESTIMATOR_ARTIFACT])

    def predict(
        self, context: Any, model_input: pd.DataFrame, params: dict[str, Any] | None = None
    ) -> pd.DataFrame:
        pred = self.estimator.predict(frame_to_batch(model_input))
        return pd.DataFrame({"p_finish": pred.p_finish, "c": pred.c})


def example_input() -> pd.DataFrame:
    """A small input example for the model signature."""
    return pd.DataFrame({"prompt_tokens": [512, 1024], "age": [0, 40], "prompt_key": ["a", "b"]})


def signature() -> Any:
    """Model signature: prompt_tokens and age (long), optional prompt_key; p_finish and c out."""
    from mlflow.models import ModelSignature
    from mlflow.types import ColSpec, Schema

    inputs = Schema(
        [
            ColSpec("long", "prompt_tokens"),
            ColSpec("long", "age"),
            ColSpec("string", "prompt_key", required=False),
        ]
    )
    outputs = Schema([ColSpec("double", "p_finish"), ColSpec("double", "c")])
    return ModelSignature(inputs=inputs, outputs=outputs)

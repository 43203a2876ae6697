"""The one completion-estimator interface, and the survival maths every estimator shares.

For a running request with age ``a`` (tokens generated so far) and hidden remaining length
``r = O - a >= 1``, an estimator answers, vectorized over a batch:

- ``p_finish = P(r <= H)``,
- ``c = E[min(r, H)]`` (in ``[1, H]`` for ``H >= 1``),
- optionally the survival curve ``P(r > h)`` for ``h = 0..H`` (column 0 is always 1).

Identities used throughout: ``c = sum_{h<H} P(r > h)`` and ``p_finish = 1 - P(r > H)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Self

import joblib
import numpy as np
import pandas as pd

DEFAULT_HORIZON = 80


@dataclass(frozen=True, slots=True)
class RunningBatch:
    """Running requests to predict for; every array has the same length ``n``."""

    prompt_tokens: np.ndarray  # int64 (n,)
    age: np.ndarray  # int64 (n,) tokens generated so far (0 right after admission)
    prompt_key: np.ndarray | None = None  # uint64 (n,) hashed prompt keys, 0 = none
    request_index: np.ndarray | None = None  # int64 (n,) rows of the replayed trace (oracle only)
    time_s: float | None = None  # wall or simulated time of the snapshot, if known

    @property
    def size(self) -> int:
        return int(self.age.shape[0])


@dataclass(frozen=True, slots=True)
class CompletedBatch:
    """Requests that just finished: what an online estimator may learn from."""

    prompt_tokens: np.ndarray  # int64 (n,)
    output_tokens: np.ndarray  # int64 (n,)
    prompt_key: np.ndarray | None = None  # uint64 (n,)
    time_s: np.ndarray | None = None  # float64 (n,) finish times

    @property
    def size(self) -> int:
        return int(self.output_tokens.shape[0])


@dataclass(frozen=True, slots=True)
class Prediction:
    """Estimator output for a batch; ``survival`` is ``(n, H+1)`` or None."""

    p_finish: np.ndarray
    c: np.ndarray
    survival: np.ndarray | None = None


class NotFittedError(RuntimeError):
    """``predict`` was called before ``fit``."""


class CompletionEstimator:
    """Base class: ``fit(history)`` returns self, ``predict(batch)`` returns a Prediction.

    Subclasses set ``name`` (the CLI/registry name) and ``provides_survival``; fitted state
    carries a trailing underscore, as in scikit-learn.
    """

    name: ClassVar[str] = ""
    provides_survival: ClassVar[bool] = False
    # How BR-H projects this estimator's running requests under ``projection="auto"``: from
    # survival curves (``expected``) when they carry a spread, from point cutoffs otherwise.
    projection: ClassVar[str] = "cutoff"
    deployable: ClassVar[bool] = True
    learns_online: ClassVar[bool] = True  # False: observe() is a no-op, callers may skip it

    def __init__(self, *, horizon: int = DEFAULT_HORIZON) -> None:
        self.horizon = int(horizon)

    def fit(self, history: pd.DataFrame) -> Self:  # pragma: no cover - interface
        raise NotImplementedError

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        raise NotImplementedError  # pragma: no cover - interface

    def observe(self, completions: CompletedBatch) -> None:
        """Online update from finished requests; the default learns nothing."""

    def check_fitted(self) -> None:
        if not getattr(self, "fitted_", False):
            raise NotFittedError(
                f"estimator '{self.name}' is not fitted: call fit(history) or load a saved one"
            )

    def params(self) -> dict[str, Any]:
        """Constructor parameters, for logging and the resolved configuration."""
        return {"horizon": self.horizon}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        joblib.dump(self, tmp)
        tmp.replace(path)
        return path

    @staticmethod
    def load(path: str | Path) -> CompletionEstimator:
        obj = joblib.load(Path(path))
        if not isinstance(obj, CompletionEstimator):
            raise TypeError(f"{path} does not hold a completion estimator (got {type(obj)})")
        return obj


def from_survival(survival: np.ndarray) -> Prediction:
    """Derive ``p_finish`` and ``c`` from survival curves ``(n, H+1)``."""
    h = survival.shape[1] - 1
    c = survival[:, :h].sum(axis=1) if h > 0 else np.zeros(survival.shape[0])
    return Prediction(p_finish=1.0 - survival[:, h], c=c, survival=survival)


def survival_from_remaining(remaining: np.ndarray, horizon: int) -> np.ndarray:
    """Exact survival curves ``1{r > h}`` for known remaining lengths ``r``."""
    hs = np.arange(horizon + 1)
    return (remaining[:, None] > hs[None, :]).astype(np.float64)

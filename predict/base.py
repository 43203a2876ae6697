"""The one completion-estimator interface, and the survival maths every estimator shares.

For a running request with age ``a`` (tokens generated so far) and hidden remaining length
``r = O - a >= 1``, an estimator answers, vectorized over a batch:

- ``p_finish = P(r <= H)``,
- ``c = E[min(r, H)]`` (in ``[1, H]`` for ``H >= 1``),
- optionally the survival curve ``P(r > h)`` for ``h = 0..H`` (column 0 is always 1).

Identities used throughout: ``c = sum_{h<H} P(r > h)`` and ``p_finish = 1 - P(r > H)``.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, ClassVar, Self, get_args, get_origin, get_type_hints

import numpy as np
import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON, MAX_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.features.limits import input_limits


class Fitting(StrEnum):
    """How an estimator gets what it knows."""

    HISTORY = "history"  # learned from earlier requests: fit(history), then online updates
    TRACE = "trace"  # reads the truth off the replayed requests themselves: a reference only
    NONE = "none"  # knows nothing and learns nothing: fit() takes no data


@dataclass(frozen=True, slots=True)
class EstimatorParams:
    """Constructor parameters every estimator has; subclasses add theirs (declared once)."""

    horizon: int = field(default=DEFAULT_HORIZON, metadata={"help": "lookahead H in iterations"})


def coerce_params(cls: type, given: dict[str, Any], owner: str) -> Any:
    """``cls(**given)`` with values cast to the declared field types (``int``, ``float``,
    ``bool``, tuples of those); unknown names are a UserError listing the known ones."""
    names = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(given) - set(names))
    if unknown:
        raise UserError(f"unknown {owner} parameter(s) {unknown}; known: {', '.join(names)}")
    hints = get_type_hints(cls)
    out = {}
    for name, value in given.items():
        kind = hints[name]
        try:
            if kind in (int, float, bool) and value is not None:
                value = kind(value)
            elif get_origin(kind) is tuple and value is not None:
                item = get_args(kind)[0]
                value = tuple(item(v) for v in value)
        except (TypeError, ValueError):
            raise UserError(f"{owner} parameter {name}: expected {kind}, got {value!r}") from None
        out[name] = value
    return cls(**out)


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

    @classmethod
    def from_positions(
        cls, table: Any, positions: np.ndarray, output_tokens: Any, finish_s: float
    ) -> Self:
        """The requests at ``positions`` of a request table (``prompt_tokens`` and
        ``prompt_key`` arrays indexed by position) that finished together at ``finish_s``
        after ``output_tokens`` tokens each."""
        return cls(
            prompt_tokens=table.prompt_tokens[positions],
            output_tokens=np.asarray(output_tokens, dtype=np.int64),
            prompt_key=table.prompt_key[positions],
            time_s=np.full(positions.shape[0], float(finish_s)),
        )

    @property
    def size(self) -> int:
        return int(self.output_tokens.shape[0])


@dataclass(frozen=True, slots=True)
class Prediction:
    """Estimator output for a batch; ``survival`` is ``(n, H+1)`` or None."""

    p_finish: np.ndarray
    c: np.ndarray
    survival: np.ndarray | None = None


class InputOutOfRange(UserError, ValueError):
    """Completions outside the bounds of :mod:`balanceroute.features.limits`."""


def check_completions(completions: CompletedBatch) -> None:
    """Refuse completions whose lengths are outside the input limits (before any state moves)."""
    lim = input_limits()
    for name, most in (
        ("output_tokens", lim.max_output_tokens),
        ("prompt_tokens", lim.max_prompt_tokens),
    ):
        values = np.asarray(getattr(completions, name))
        if values.size and (values.min() < 1 or values.max() > most):
            bad = values[(values < 1) | (values > most)][0]
            raise InputOutOfRange(f"{name} must be between 1 and {most:,}, got {bad}")


def _checked_observe(observe: Callable[..., None]) -> Callable[..., None]:
    """``observe`` that first checks its completions against the input limits."""

    @functools.wraps(observe)
    def checked(self: CompletionEstimator, completions: CompletedBatch) -> None:
        check_completions(completions)
        observe(self, completions)

    checked.checks_limits = True  # type: ignore[attr-defined]
    return checked


class NotFittedError(RuntimeError):
    """``predict`` was called before ``fit``."""


class CompletionEstimator:
    """Base class: ``fit(history)`` returns self, ``predict(batch)`` returns a Prediction.

    A subclass declares its ``name`` (the CLI and registry name), its constructor parameters as
    a ``Params`` dataclass (the constructor stores each one as an attribute, as in scikit-learn),
    and its capabilities: how it is fitted, whether it is deployable, whether it learns online,
    whether it gives survival curves and how BR-H should project it. Fitted state carries a
    trailing underscore.
    """

    name: ClassVar[str] = ""
    Params: ClassVar[type] = EstimatorParams
    fitting: ClassVar[Fitting] = Fitting.HISTORY
    provides_survival: ClassVar[bool] = False
    # How BR-H projects this estimator's running requests under ``projection="auto"``: from
    # survival curves (``expected``) when they carry a spread, from point cutoffs otherwise.
    projection: ClassVar[str] = "cutoff"
    deployable: ClassVar[bool] = True
    learns_online: ClassVar[bool] = True  # False: observe() is a no-op, callers may skip it

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """Every estimator's own ``observe`` is wrapped by :func:`check_completions`: no online
        update, whoever wrote it, sees lengths beyond the input limits."""
        super().__init_subclass__(**kwargs)
        own = cls.__dict__.get("observe")
        if own is not None and not getattr(own, "checks_limits", False):
            cls.observe = _checked_observe(own)  # type: ignore[method-assign]

    def __init__(self, **params: Any) -> None:
        label = type(self).name if isinstance(type(self).name, str) else type(self).__name__
        resolved = coerce_params(self.Params, params, f"estimator '{label}'")
        if not 1 <= resolved.horizon <= MAX_HORIZON:
            raise UserError(
                f"estimator '{label}': horizon must be in 1..{MAX_HORIZON}, got {resolved.horizon}"
            )
        for f in dataclasses.fields(resolved):
            setattr(self, f.name, getattr(resolved, f.name))

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

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Hook: bring the pickled state of a model saved by an older release up to date."""
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(self.upgrade_state(dict(state)))

    def params(self) -> dict[str, Any]:
        """Constructor parameters, for logging and the resolved configuration."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self.Params)}


def from_survival(survival: np.ndarray) -> Prediction:
    """Derive ``p_finish`` and ``c`` from survival curves ``(n, H+1)``."""
    h = survival.shape[1] - 1
    c = survival[:, :h].sum(axis=1) if h > 0 else np.zeros(survival.shape[0])
    return Prediction(p_finish=1.0 - survival[:, h], c=c, survival=survival)


def survival_from_remaining(remaining: np.ndarray, horizon: int) -> np.ndarray:
    """Exact survival curves ``1{r > h}`` for known remaining lengths ``r``."""
    hs = np.arange(horizon + 1)
    return (remaining[:, None] > hs[None, :]).astype(np.float64)

"""One way to build an estimator ready to predict, from a spec string such as ``gbdt@URI``.

``kind`` alone builds and fits one (on history, on the replayed requests for the references, or
on nothing, as the estimator's :class:`~balanceroute.predict.base.Fitting` says); ``kind@URI``
loads a saved or registered one and checks it is of that kind.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from balanceroute.features.digest import request_fingerprints
from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator, Fitting
from balanceroute.predict.model_store import load_estimator
from balanceroute.predict.registry import estimator_class, make_estimator


@dataclass(frozen=True, slots=True)
class EstimatorSpec:
    """An estimator kind, where to load it from (if anywhere), and parameter overrides."""

    kind: str
    model_uri: str | None = None
    params: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        estimator_class(self.kind)  # unknown kinds fail now, listing the known ones

    @classmethod
    def parse(cls, text: str) -> EstimatorSpec:
        """``kind`` or ``kind@model-uri`` (the URI may itself hold ``@``, as in an alias)."""
        kind, _, uri = text.strip().partition("@")
        if not kind:
            raise UserError(f"estimator spec '{text}' names no estimator kind")
        return cls(kind, uri or None)

    def __str__(self) -> str:
        return self.kind if self.model_uri is None else f"{self.kind}@{self.model_uri}"

    @property
    def fitting(self) -> Fitting:
        """How this spec's estimator gets its knowledge (a loaded model needs nothing more)."""
        return Fitting.NONE if self.model_uri else estimator_class(self.kind).fitting

    @property
    def needs_history(self) -> bool:
        """Whether building it takes training history."""
        return self.fitting is Fitting.HISTORY


def build_estimator(
    spec: EstimatorSpec,
    *,
    history: pd.DataFrame | None = None,
    replay: pd.DataFrame | None = None,
    horizon: int | None = None,
) -> CompletionEstimator:
    """An estimator ready to predict on ``replay``: loaded, fitted on ``history`` (learned
    estimators) or on ``replay`` (the references that read the truth), or fitted on nothing."""
    if spec.model_uri is not None:
        est = load_estimator(spec.model_uri)
        if est.name != spec.kind:
            raise UserError(
                f"model {spec.model_uri} holds a '{est.name}' estimator, not '{spec.kind}'"
            )
        return est
    params = dict(spec.params)
    if horizon is not None:
        params.setdefault("horizon", horizon)
    est = make_estimator(spec.kind, **params)
    if est.fitting is Fitting.NONE:
        return est.fit(None)
    data = history if est.fitting is Fitting.HISTORY else replay
    if data is None:
        needs = (
            "training history or a model URI"
            if est.fitting is Fitting.HISTORY
            else "the replayed requests"
        )
        raise UserError(f"estimator '{spec.kind}' needs {needs}")
    est.fit(data)
    if est.fitting is Fitting.HISTORY:
        # what it has seen, so that an evaluation never scores it on its own training requests
        est.fitted_requests_ = request_fingerprints(data)
    return est

"""Estimator registry: CLI name -> class. Unknown names fail listing the known ones."""

from __future__ import annotations

from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.exactmatch import ExactMatchEstimator
from balanceroute.predict.gbdt import GBDTEstimator
from balanceroute.predict.hazard import HazardEstimator
from balanceroute.predict.histogram import HistogramEstimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.noisy_oracle import NoisyOracleEstimator
from balanceroute.predict.oracle import OracleEstimator
from balanceroute.predict.osl_hint import OslHintEstimator
from balanceroute.predict.posterior import PosteriorEstimator
from balanceroute.predict.survival import SurvivalEstimator

ESTIMATORS: dict[str, type[CompletionEstimator]] = {
    cls.name: cls
    for cls in (
        NoPrediction,
        OracleEstimator,
        NoisyOracleEstimator,
        PosteriorEstimator,
        SurvivalEstimator,
        ExactMatchEstimator,
        GBDTEstimator,
        HazardEstimator,
        HistogramEstimator,
        OslHintEstimator,
    )
}


def estimator_names(*, deployable: bool | None = None) -> list[str]:
    """Registered names, sorted; ``deployable`` keeps only those that are (or are not)."""
    return sorted(name for name, cls in ESTIMATORS.items() if deployable in (None, cls.deployable))


def estimator_class(name: str) -> type[CompletionEstimator]:
    """The class registered as ``name``; unknown names list the known ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise UserError(
            f"unknown estimator '{name}'; known estimators: {', '.join(estimator_names())}"
        ) from None


def make_estimator(name: str, **params: Any) -> CompletionEstimator:
    """An unfitted estimator by registry name, with its parameters."""
    return estimator_class(name)(**params)

"""Estimator registry: CLI name -> class. Unknown names fail listing the known ones."""

from __future__ import annotations

from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.oracle import OracleEstimator

ESTIMATORS: dict[str, type[CompletionEstimator]] = {
    NoPrediction.name: NoPrediction,
    OracleEstimator.name: OracleEstimator,
}


def register(cls: type[CompletionEstimator]) -> type[CompletionEstimator]:
    """Class decorator adding an estimator under its ``name``."""
    ESTIMATORS[cls.name] = cls
    return cls


def _load_optional() -> None:
    # Learned estimators live in their own modules; importing them registers them.
    import importlib

    for mod in (
        "balanceroute.predict.survival",
        "balanceroute.predict.exactmatch",
        "balanceroute.predict.gbdt",
        "balanceroute.predict.noisy_oracle",
    ):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


def estimator_names() -> list[str]:
    _load_optional()
    return sorted(ESTIMATORS)


def make_estimator(name: str, **params: Any) -> CompletionEstimator:
    """Build an unfitted estimator by registry name."""
    _load_optional()
    try:
        cls = ESTIMATORS[name]
    except KeyError:
        raise UserError(
            f"unknown estimator '{name}'; known estimators: {', '.join(sorted(ESTIMATORS))}"
        ) from None
    return cls(**params)

"""Where a consumer's twin starts from a model's prior (simulate, ab, evaluate, the service and the gateway)."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field, replace
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.lab.twin.prior import PRIOR_ATTRIBUTE, TwinPrior, model_priors
from balanceroute.router.lab.twin.sequential import SequentialTest


def prior_config(prior: TwinPrior, config: TwinConfig | None = None) -> TwinConfig:
    """``config`` with its start weight at the prior's (a UserError if it is no candidate)."""
    config = config or TwinConfig()
    if prior.start_weight not in config.candidates:
        raise UserError(
            f"twin prior: start weight {prior.start_weight:g} is not one of this twin's "
            f"candidates {list(config.candidates)}"
        )
    return replace(config, start_weight=prior.start_weight)


def prior_test(prior: TwinPrior, config: TwinConfig | None = None) -> SequentialTest:
    """The sequential test a twin starts from: at the prior's weight, no online evidence yet
    (it needs ``min_windows`` blocks of its own, and the cooldown, before it can switch)."""
    cfg = prior_config(prior, config)
    return SequentialTest(tuple(cfg.candidates), cfg)


@dataclass(frozen=True)
class PriorStart:
    """Where a consumer's twin starts from a model's prior, and why (``test`` None: ``w = 0``)."""

    test: SequentialTest | None
    note: str
    stats: dict[str, Any] = field(default_factory=dict)


def prior_start(
    estimator: CompletionEstimator | None,
    workers: int,
    slots: int,
    load: float | None,
    config: TwinConfig | None = None,
) -> PriorStart | None:
    """The start of a twin beside ``estimator`` on a ``workers`` x ``slots`` group at ``load``
    (None: saturated) from the model's prior: None when the model carries none; a start at
    ``w = 0`` with the reason when no prior fits this shape or the prior does not parse."""
    if estimator is None or getattr(estimator, PRIOR_ATTRIBUTE, None) is None:
        return None
    config = config or TwinConfig()
    try:
        priors = model_priors(estimator, f"the '{estimator.name}' model")
    except UserError as exc:
        return PriorStart(None, f"{exc}; the twin starts at w = 0", {"twin_prior": "invalid"})
    fit = [p for p in priors if p.workers == workers and p.slots == slots]
    if not fit:
        shapes = ", ".join(p.group for p in priors) or "no shape"
        note = (
            f"twin prior measured on {shapes}, this group is {workers}x{slots}: not used, the "
            "twin starts at w = 0"
        )
        return PriorStart(None, note, {"twin_prior": "other shape"})
    prior = min(fit, key=lambda p: _load_distance(p.load, load))
    if prior.start_weight not in config.candidates:
        note = f"twin prior's weight {prior.start_weight:g} is no candidate here: w = 0"
        return PriorStart(None, note, {"twin_prior": "other candidates"})
    stats = {
        "twin_prior": "used",
        "twin_prior_weight": prior.start_weight,
        "twin_prior_group": prior.group,
        "twin_prior_windows": prior.windows,
        "twin_prior_folds": prior.folds,
        "twin_prior_mean_log_ratios": list(prior.mean_log_ratio),
        "twin_prior_se": list(prior.se),
        "twin_prior_upper": list(prior.upper),
    }
    here = "saturated" if load is None else f"at {load:g}x"
    where = "the holdout" if prior.folds == 1 else f"{prior.folds} cross-fitted folds"
    note = (
        f"twin prior ({prior.group}, {prior.windows} windows of {where}): starting at "
        f"w = {prior.start_weight:g}"
    )
    if prior.load != load:
        note += f" (this group runs {here}; the online test decides from here)"
    return PriorStart(prior_test(prior, config), note, stats)


def live_start(
    estimator: CompletionEstimator | None, workers: int, slots: int, config: TwinConfig
) -> SequentialTest | None:
    """Where a live twin (service, gateway) beside ``estimator`` starts: the model's prior for
    this ``workers`` x ``slots`` group (saturated), else None (``w = 0``); logs which and why."""
    begun = prior_start(estimator, workers, slots, None, config)
    if begun is None:
        return None
    logging.getLogger("balanceroute.twin").info("%s", begun.note)
    return begun.test


def _load_distance(a: float | None, b: float | None) -> float:
    """How far apart two loads are (saturated counts as a very high load)."""
    x = 100.0 if a is None else a
    y = 100.0 if b is None else b
    return abs(math.log(x / y))

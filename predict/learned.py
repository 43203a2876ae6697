"""What the LightGBM estimators (``gbdt``, ``hazard``) share, declared once: the parameters of
their boosters, training snapshots, causal features and calibration, and the online part of
their life (the feature history started from the training trace, learning from completions)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.features.causal import CausalConfig, OnlineHistory
from balanceroute.features.errors import UserError
from balanceroute.features.schema import TraceArrays
from balanceroute.predict.base import CompletedBatch, CompletionEstimator, EstimatorParams

# How training rows are weighted: every request alike, or by its time at risk (the iterations it
# runs, as a router meets it; docs/design.md, "What an estimator is judged on")
WEIGHTINGS = ("time-at-risk", "request")


@dataclass(frozen=True, slots=True)
class LearnedParams(EstimatorParams):
    """Parameters of a LightGBM estimator on causal features; subclasses add theirs."""

    n_estimators: int = field(default=150, metadata={"help": "classifier boosting rounds"})
    learning_rate: float = field(default=0.1, metadata={"help": "classifier learning rate"})
    num_leaves: int = field(default=8, metadata={"help": "classifier leaves per tree"})
    max_depth: int = field(default=3, metadata={"help": "classifier tree depth"})
    min_data_in_leaf: int = field(default=500, metadata={"help": "rows per leaf at least"})
    lambda_l2: float = field(default=10.0, metadata={"help": "classifier L2 regularisation"})
    feature_fraction: float = field(default=0.7, metadata={"help": "features tried per tree"})
    step: int = field(default=8, metadata={"help": "age grid of the training snapshots"})
    weighting: str = field(
        default="time-at-risk",
        metadata={
            "help": "training and recalibration rows weighted by each request's running time "
            "(time-at-risk: as a router meets it) or every request alike (request)"
        },
    )
    per_request: int = field(default=32, metadata={"help": "training snapshots per request"})
    calib_fraction: float = field(
        default=0.1, metadata={"help": "latest share of requests held out to calibrate"}
    )
    refit_full: bool = field(
        default=True, metadata={"help": "retrain the classifier on every row after calibrating"}
    )
    recalibrate: bool = field(default=True, metadata={"help": "online Platt recalibration"})
    recal_window: int = field(default=2000, metadata={"help": "recalibration pairs kept"})
    recal_ages: int = field(default=2, metadata={"help": "recalibration ages per completion"})
    recal_prior: float = field(
        default=0.25, metadata={"help": "weight of the calibration slice in recalibration"}
    )
    assumed_tpot_s: float = field(
        default=0.06, metadata={"help": "seconds per decode step of the trace timing model"}
    )
    window: int = field(default=131_072, metadata={"help": "completions in the feature window"})
    cond_windows: tuple[int, ...] = field(
        default=(1024,), metadata={"help": "shorter windows of the stacked empirical features"}
    )
    num_threads: int = field(default=0, metadata={"help": "LightGBM training threads (0: all)"})
    seed: int = field(default=0, metadata={"help": "seed of sampling and boosting"})


def check_weighting(weighting: str) -> None:
    """Refuse an unknown ``weighting`` when the parameters are built, not mid-fit."""
    if weighting not in WEIGHTINGS:
        raise UserError(f"unknown weighting '{weighting}'; known: {', '.join(WEIGHTINGS)}")


class LearnedEstimator(CompletionEstimator):
    """Base of the LightGBM estimators: booster settings, history and online updates.

    A subclass fits its boosters, then calls :meth:`start_history`; it implements
    ``_recalibrate(completions)``, which scores finished requests with the history as it stood
    before they finished and feeds its online recalibrator.
    """

    Params = LearnedParams
    provides_survival = True
    projection = "expected"

    def classifier_params(self) -> dict[str, Any]:
        """LightGBM parameters of the (binary) classifier."""
        return {
            "objective": "binary",
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "max_depth": self.max_depth,
            "min_data_in_leaf": self.min_data_in_leaf,
            "lambda_l2": self.lambda_l2,
            "feature_fraction": self.feature_fraction,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "verbose": -1,
        }

    @property
    def time_at_risk(self) -> bool:
        """Whether rows are weighted by time at risk."""
        return self.weighting == "time-at-risk"

    def length_weights(self, lengths: np.ndarray) -> np.ndarray | None:
        """Weights of recalibration pairs drawn at uniform ages of finished requests: their
        lengths (time at risk, mean 1 over the training requests) or none (every request
        alike)."""
        if not self.time_at_risk:
            return None
        return np.asarray(lengths, dtype=np.float64) / self.mean_output_

    def start_history(self, arrays: TraceArrays, cfg: CausalConfig) -> None:
        """The online feature state, having observed the training requests in finish order."""
        self.config_ = cfg
        self.mean_output_ = float(np.mean(arrays.output_tokens))
        self.history_ = OnlineHistory(cfg)
        finish = cfg.finish_times(arrays)
        o = np.argsort(finish, kind="stable")
        self.history_.observe(
            arrays.prompt_tokens[o], arrays.output_tokens[o], arrays.prompt_key[o], finish[o]
        )
        self.rng_ = np.random.default_rng(self.seed)

    def observe(self, completions: CompletedBatch) -> None:
        """Learn from finished requests (in finish order): recalibration pairs, then history.

        Each finished request is first scored at ``recal_ages`` random ages with the history as
        it stood before it finished (it is not in there yet), and the (score, outcome) pairs go
        to the online recalibrator; only then does the history take it in.
        """
        self.check_fitted()
        if self.recalibrate and self.recal_ages > 0 and completions.size:
            self._recalibrate(completions)
        self.history_.observe(
            completions.prompt_tokens,
            completions.output_tokens,
            completions.prompt_key,
            completions.time_s,
        )

    def _recalibrate(self, completions: CompletedBatch) -> None:  # pragma: no cover - interface
        raise NotImplementedError

"""``hazard``: a discrete-time hazard model, each running request's own survival curve.

One LightGBM classifier of the chance to finish in each age bin given survival to its start
(docs/design.md, "Estimators"):

- the horizon ``1..H`` ahead of a request is cut into ``bins`` bins, one iteration wide near the
  present and widening toward ``H`` (:func:`balanceroute.features.causal.hazard_bins`), because
  BR-H's discounted projection weighs the next few iterations most;
- training rows are person-period rows (:func:`balanceroute.features.causal.person_period_rows`)
  of :func:`balanceroute.features.causal.training_rows` snapshots, weighted by time at risk
  (``weighting``: as a router meets running requests): one row per bin a snapshot is at risk in,
  labelled 1 in the bin where it finished, a ``survivor_fraction`` of the non-event rows kept
  and reweighted; each row holds the snapshot's causal features
  (:func:`balanceroute.features.causal.trace_snapshot_features`) but those of the latest few
  completions and of the clock (unless ``recent_features``), its bin, and the empirical
  estimators' own chance to finish in that bin at that age
  (:func:`balanceroute.features.causal.trace_period_features`), so the booster learns a
  correction of ``survival`` and ``exactmatch`` rather than the hazard from scratch;
- the hazards are calibrated (Platt on the logit of the per-bin hazard) on the latest
  ``calib_fraction`` of the training requests, held out of the booster, which is then (with
  ``refit_full``) retrained on every row; ``observe()`` recalibrates online like ``gbdt`` does,
  from finished requests scored at random ages before they are learned (weighted by length);
- the curve is the product of the bins' survivals, spread within a bin as a constant
  per-iteration hazard (:func:`balanceroute.predict.curves.hazard_curves`), so ``p_finish`` and
  ``c`` are the curve's own (``from_survival``);
- prediction walks the booster flattened to arrays (:meth:`Forest.raw_grouped`: splits on a
  request's own features once per request, on its bins' once per bin); the saved model keeps
  LightGBM's model text but no booster object, as ``gbdt`` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from balanceroute.features.causal import (
    CausalConfig,
    hazard_bins,
    period_design,
    period_rows,
    person_period_rows,
    trace_period_features,
    trace_snapshot_features,
    training_rows,
)
from balanceroute.features.errors import UserError
from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import (
    CompletedBatch,
    Prediction,
    RunningBatch,
    from_survival,
)
from balanceroute.predict.calibration import (
    expected_calibration_error,
    fit_platt_online,
    logit,
    platt_scaled,
    recalibration_snapshots,
    sigmoid,
)
from balanceroute.predict.curves import hazard_curves
from balanceroute.predict.forest import Forest
from balanceroute.predict.learned import LearnedEstimator, LearnedParams, check_weighting

if TYPE_CHECKING:
    import lightgbm as lgb
    import pandas as pd

PRIOR_SAMPLE = 2048  # calibration-slice rows kept as the online recalibration's prior


@dataclass(frozen=True, slots=True)
class HazardParams(LearnedParams):
    """The parameters of :class:`HazardEstimator` (its constructor takes each by keyword); the
    booster, snapshot and calibration ones are ``gbdt``'s, some with other defaults."""

    n_estimators: int = field(default=200, metadata={"help": "boosting rounds"})
    num_leaves: int = field(default=15, metadata={"help": "leaves per tree"})
    max_depth: int = field(default=4, metadata={"help": "tree depth"})
    per_request: int = field(default=8, metadata={"help": "training snapshots per request"})
    recal_window: int = field(default=4000, metadata={"help": "recalibration pairs kept"})
    bins: int = field(default=12, metadata={"help": "age bins over the horizon (geometric)"})
    max_snapshots: int = field(default=250_000, metadata={"help": "training snapshots at most"})
    survivor_fraction: float = field(
        default=0.5, metadata={"help": "share of non-event person-period rows kept (reweighted)"}
    )
    key_sources: tuple[str, ...] = field(
        default=("exact-length", "hash"), metadata={"help": "prompt keys of the per-key features"}
    )
    conversation: bool = field(
        default=False,
        metadata={"help": "features of the key's last finished request (the previous turn)"},
    )
    recent_features: bool = field(
        default=False,
        metadata={
            "help": "also learn from the latest completions (EWMAs, short windows) and the clock"
        },
    )

    def __post_init__(self) -> None:
        check_weighting(self.weighting)
        if self.bins < 1:
            raise UserError(f"hazard: bins must be at least 1, got {self.bins}")
        if not 0.0 < self.survivor_fraction <= 1.0:
            raise UserError(
                f"hazard: survivor_fraction must be in (0, 1], got {self.survivor_fraction}"
            )


class HazardEstimator(LearnedEstimator):
    """Calibrated discrete-time hazard model (LightGBM on person-period rows)."""

    name = "hazard"
    Params = HazardParams

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Models saved before ``weighting`` said ``at_risk``."""
        if "weighting" not in state:
            state["weighting"] = "time-at-risk" if state.pop("at_risk", True) else "request"
        return state

    def fit(self, history: pd.DataFrame) -> Self:
        import lightgbm as lgb

        if len(history) < 10:
            raise UserError(f"hazard needs at least 10 requests to train, got {len(history)}")
        short = tuple(min(w, self.window) for w in self.cond_windows)
        cfg = CausalConfig(
            assumed_tpot_s=self.assumed_tpot_s,
            window=self.window,
            horizon=self.horizon,
            cond_windows=short if self.recent_features else (),
            key_sources=self.key_sources,
            conversation=self.conversation,
            **({} if self.recent_features else {"key_windows": ()}),
        )
        ends = hazard_bins(self.horizon, self.bins)
        arrays = to_arrays(history)
        req, age, weight = training_rows(
            arrays.output_tokens,
            step=self.step,
            per_request=self.per_request,
            max_rows=self.max_snapshots,
            seed=self.seed,
            at_risk=self.time_at_risk,
        )
        x = trace_snapshot_features(arrays, req, age, cfg)
        periods = trace_period_features(arrays, req, age, cfg, ends)
        snap, bins, y, row_weight = person_period_rows(
            arrays.output_tokens[req] - age,
            ends,
            survivor_fraction=self.survivor_fraction,
            seed=self.seed,
        )
        # float32 halves the largest matrix; rows are in request order, so the calibration
        # slice (the latest requests) is the tail and the fitting rows a view of the head
        columns = self._columns(cfg)
        z = period_design(x, periods, snap, bins, ends, dtype=np.float32, columns=columns)
        w = weight[snap] * row_weight
        del x, periods
        n_fit = int(np.searchsorted(req[snap], int(arrays.size * (1.0 - self.calib_fraction))))
        if n_fit in (0, snap.size):
            raise UserError("hazard: too few requests to hold some out for calibration")
        names = [cfg.feature_names[c] for c in columns]
        names += ["bin_start", "bin_width", *cfg.period_feature_names]
        params = self.classifier_params()
        full = lgb.Dataset(z, y, weight=w, feature_name=names, free_raw_data=False)
        booster = lgb.train(params, full.subset(np.arange(n_fit)), self.n_estimators)
        self.forest_ = Forest.from_booster(booster)
        self._fit_calibrator(z[n_fit:], y[n_fit:], w[n_fit:])
        if self.refit_full:
            booster = lgb.train(params, full, self.n_estimators)
            self.forest_ = Forest.from_booster(booster)
        self.booster_text_ = booster.model_to_string()
        self.feature_names_ = names
        self.n_rows_ = int(snap.size)
        self.ends_ = ends
        self.columns_ = columns
        self.start_history(arrays, cfg)
        self.fitted_ = True
        return self

    def _columns(self, cfg: CausalConfig) -> np.ndarray:
        """The snapshot features the booster sees: all, or all but the recent and clock ones."""
        drop = () if self.recent_features else cfg.recent_features
        return np.array([i for i, n in enumerate(cfg.feature_names) if n not in drop])

    def booster(self) -> lgb.Booster:
        """The fitted LightGBM booster, rebuilt from its saved model text."""
        import lightgbm as lgb

        self.check_fitted()
        return lgb.Booster(model_str=self.booster_text_)

    def _fit_calibrator(self, z: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        """Platt scaling of the per-bin hazard on the held-out rows, and its online twin."""
        raw = logit(sigmoid(self.forest_.raw(z)))
        self.platt_, self.recalibrator_ = fit_platt_online(
            raw,
            y,
            w,
            seed=self.seed,
            prior_sample=PRIOR_SAMPLE,
            window=self.recal_window,
            prior_weight=self.recal_prior,
        )
        platt = platt_scaled(raw, self.platt_)
        self.calibration_report_ = {
            "calib_ece_none": expected_calibration_error(sigmoid(raw), y, weight=w),
            "calib_ece_platt": expected_calibration_error(platt, y, weight=w),
        }

    def _score(
        self, time_s: float | None, prompts: np.ndarray, age: np.ndarray, keys: np.ndarray | None
    ) -> np.ndarray:
        """Uncalibrated hazard logits of every bin for each snapshot, ``(n * bins,)``
        snapshot-major; the snapshot's features are shared by its bins' rows."""
        hist, ends = self.history_, self.ends_
        x = hist.features(time_s, prompts, age, keys)[:, self.columns_]
        periods = hist.period_features(prompts, age, keys, ends)
        n, bins = age.shape[0], ends.size
        own = period_rows(periods, np.repeat(np.arange(n), bins), np.tile(np.arange(bins), n), ends)
        return logit(sigmoid(self.forest_.raw_grouped(x, own)))

    def hazards(self, batch: RunningBatch) -> np.ndarray:
        """Calibrated chance to finish in each bin given survival to its start, ``(n, bins)``."""
        self.check_fitted()
        age = np.asarray(batch.age, dtype=np.int64)
        prompts = np.asarray(batch.prompt_tokens, dtype=np.int64)
        raw = self._score(batch.time_s, prompts, age, batch.prompt_key)
        hz = platt_scaled(raw, self.platt_, self.recalibrator_ if self.recalibrate else None)
        return hz.reshape(age.shape[0], self.ends_.size)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        if batch.size == 0:
            empty = np.zeros(0)
            return Prediction(empty, empty, np.zeros((0, self.horizon + 1)) if survival else None)
        curves = hazard_curves(np.ascontiguousarray(self.hazards(batch)), self.ends_)
        pred = from_survival(curves)
        return pred if survival else Prediction(pred.p_finish, pred.c)

    def _recalibrate(self, completions: CompletedBatch) -> None:
        """Person-period rows of finished requests at random ages (hazard score, finished in
        the bin) for the online recalibrator, weighted by time at risk by default."""
        snap = recalibration_snapshots(completions, self.rng_, self.recal_window, self.recal_ages)
        rows, bins, y, _ = person_period_rows(snap.remaining, self.ends_)
        scores = self._score(snap.now, snap.prompt_tokens, snap.age, snap.prompt_key)
        raw = scores[rows * self.ends_.size + bins]
        # ages are uniform within each request's life: weighing a request by its length
        # makes the pairs a sample of the running requests a router meets
        w = self.length_weights((snap.age + snap.remaining)[rows])
        self.recalibrator_.add(raw, y, w)

"""``gbdt``: LightGBM on causal features, ``c = p * E[r | r <= H] + (1 - p) * H``.

- a binary classifier for ``1{r <= H}`` and a regressor for ``r`` on finishing rows, both trained
  on :func:`features.causal.training_rows` snapshots with :func:`features.causal.snapshot_features`;
- at predict time the same features come from :class:`features.causal.OnlineHistory`, which
  ``observe()`` keeps up to date within a bounded window (train/serve parity is tested);
- probabilities are calibrated on the latest ``calib_fraction`` of training requests (held out of
  the boosters): ``isotonic``, ``platt`` or ``none``; all three are fitted, so the choice can be
  switched and compared after training (``calibration_report_`` holds the held-out ECEs);
- survival curves: within the horizon the finishing mass ``p`` is spread over ``1..H`` as a
  truncated geometric whose mean matches the regressor's ``E[r | r <= H]`` (a per-request constant
  discrete hazard), so ``from_survival`` reproduces ``p`` and ``c``;
- prediction runs LightGBM single-threaded (``num_threads=1``): cheaper than OpenMP for router
  batches and safe inside a server thread.
"""

from __future__ import annotations

from typing import Any, Self

import lightgbm as lgb
import numpy as np
import pandas as pd
from sklearn.isotonic import IsotonicRegression
from sklearn.linear_model import LogisticRegression

from features.causal import (
    CausalConfig,
    OnlineHistory,
    trace_snapshot_features,
    training_rows,
)
from features.errors import UserError
from features.schema import to_arrays
from predict.base import (
    DEFAULT_HORIZON,
    CompletedBatch,
    CompletionEstimator,
    Prediction,
    RunningBatch,
)
from predict.registry import register
from training.metrics import expected_calibration_error

CALIBRATIONS = ("isotonic", "platt", "none")
_THETA = np.linspace(-8.0, 8.0, 2001)


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def _geometric_means(horizon: int) -> np.ndarray:
    """Mean of the truncated geometric on 1..H with log-ratio theta, for every grid theta."""
    j = np.arange(1, horizon + 1, dtype=np.float64)
    logw = _THETA[:, None] * (j - 1)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    return (w * j).sum(axis=1) / w.sum(axis=1)


def within_horizon_curves(p: np.ndarray, mean: np.ndarray, horizon: int) -> np.ndarray:
    """Survival curves ``(n, H+1)``: ``1 - p * G(h)``, G a truncated geometric with this mean."""
    h = int(horizon)
    n = p.shape[0]
    if h == 0:
        return np.ones((n, 1))
    mu = _geometric_means(h)
    theta = np.interp(np.clip(mean, mu[0], mu[-1]), mu, _THETA)
    logw = theta[:, None] * np.arange(h)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    g = np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True)  # G(1..H)
    curves = np.ones((n, h + 1))
    curves[:, 1:] = 1.0 - p[:, None] * g
    return curves


@register
class GBDTEstimator(CompletionEstimator):
    """Calibrated LightGBM classifier + regressor on causal history features."""

    name = "gbdt"
    provides_survival = True

    def __init__(
        self,
        *,
        horizon: int = DEFAULT_HORIZON,
        n_estimators: int = 120,
        learning_rate: float = 0.12,
        num_leaves: int = 15,
        min_data_in_leaf: int = 500,
        step: int = 8,
        per_request: int = 32,
        max_rows: int = 1_000_000,
        calibration: str = "platt",
        calib_fraction: float = 0.1,
        assumed_tpot_s: float = 0.06,
        window: int = 131_072,
        num_threads: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__(horizon=horizon)
        if calibration not in CALIBRATIONS:
            raise UserError(
                f"unknown calibration '{calibration}'; known: {', '.join(CALIBRATIONS)}"
            )
        self.n_estimators = int(n_estimators)
        self.learning_rate = float(learning_rate)
        self.num_leaves = int(num_leaves)
        self.min_data_in_leaf = int(min_data_in_leaf)
        self.step = int(step)
        self.per_request = int(per_request)
        self.max_rows = int(max_rows)
        self.calibration = calibration
        self.calib_fraction = float(calib_fraction)
        self.assumed_tpot_s = float(assumed_tpot_s)
        self.window = int(window)
        self.num_threads = int(num_threads)
        self.seed = int(seed)

    def params(self) -> dict[str, Any]:
        keys = (
            "horizon n_estimators learning_rate num_leaves min_data_in_leaf step per_request "
            "max_rows calibration calib_fraction assumed_tpot_s window num_threads seed"
        ).split()
        return {k: getattr(self, k) for k in keys}

    def _booster_params(self, objective: str) -> dict[str, Any]:
        return {
            "objective": objective,
            "learning_rate": self.learning_rate,
            "num_leaves": self.num_leaves,
            "min_data_in_leaf": self.min_data_in_leaf,
            "feature_fraction": 0.9,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "verbose": -1,
        }

    def fit(self, history: pd.DataFrame) -> Self:
        if len(history) < 10:
            raise UserError(f"gbdt needs at least 10 requests to train, got {len(history)}")
        cfg = CausalConfig(assumed_tpot_s=self.assumed_tpot_s, window=self.window)
        arrays = to_arrays(history)
        req, age, weight = training_rows(
            arrays.output_tokens,
            step=self.step,
            per_request=self.per_request,
            max_rows=self.max_rows,
            seed=self.seed,
        )
        x = trace_snapshot_features(arrays, req, age, cfg)
        r = arrays.output_tokens[req] - age
        y = (r <= self.horizon).astype(np.float64)
        calib = req >= int(arrays.size * (1.0 - self.calib_fraction))
        if calib.all() or not calib.any():
            raise UserError("gbdt: too few requests to hold some out for calibration")
        fit = ~calib
        names = list(cfg.feature_names)
        self.classifier_ = lgb.train(
            self._booster_params("binary"),
            lgb.Dataset(x[fit], y[fit], weight=weight[fit], feature_name=names),
            num_boost_round=self.n_estimators,
        )
        fin = fit & (y > 0)
        self.regressor_ = lgb.train(
            self._booster_params("regression"),
            lgb.Dataset(x[fin], r[fin].astype(np.float64), weight=weight[fin], feature_name=names),
            num_boost_round=max(self.n_estimators // 3, 1),
        )
        self._fit_calibrators(x[calib], y[calib], weight[calib])
        self.feature_names_ = names
        self.n_rows_ = int(x.shape[0])
        self.config_ = cfg
        self.history_ = OnlineHistory(cfg)
        finish = cfg.finish_times(arrays)
        o = np.argsort(finish, kind="stable")
        self.history_.observe(
            arrays.prompt_tokens[o], arrays.output_tokens[o], arrays.prompt_key[o], finish[o]
        )
        self.fitted_ = True
        return self

    def _fit_calibrators(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        raw = self.classifier_.predict(x, num_threads=self.num_threads)
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        iso.fit(raw, y, sample_weight=w)
        platt = LogisticRegression(C=1e6).fit(_logit(raw)[:, None], y, sample_weight=w)
        self.calibrators_ = {
            "isotonic": (iso.X_thresholds_.copy(), iso.y_thresholds_.copy()),
            "platt": (float(platt.coef_[0, 0]), float(platt.intercept_[0])),
        }
        self.calibration_report_ = {
            f"calib_ece_{name}": expected_calibration_error(self._calibrate(raw, name), y, weight=w)
            for name in CALIBRATIONS
        }

    def _calibrate(self, raw: np.ndarray, how: str) -> np.ndarray:
        if how == "isotonic":
            xs, ys = self.calibrators_["isotonic"]
            return np.interp(raw, xs, ys)
        if how == "platt":
            a, b = self.calibrators_["platt"]
            return 1.0 / (1.0 + np.exp(-(a * _logit(raw) + b)))
        return raw

    def observe(self, completions: CompletedBatch) -> None:
        """Feed finished requests (in finish order) to the history features."""
        self.check_fitted()
        self.history_.observe(
            completions.prompt_tokens,
            completions.output_tokens,
            completions.prompt_key,
            completions.time_s,
        )

    def features(self, batch: RunningBatch) -> np.ndarray:
        """The causal feature matrix the boosters see for a batch."""
        self.check_fitted()
        return self.history_.features(
            batch.time_s,
            np.asarray(batch.prompt_tokens),
            np.asarray(batch.age),
            batch.prompt_key,
        )

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        h = self.horizon
        if batch.size == 0:
            empty = np.zeros(0)
            return Prediction(empty, empty, np.zeros((0, h + 1)) if survival else None)
        x = self.features(batch)
        raw = self.classifier_.predict(x, num_threads=1)
        p = np.clip(self._calibrate(raw, self.calibration), 0.0, 1.0)
        mean = np.clip(self.regressor_.predict(x, num_threads=1), 1.0, h)
        if survival:
            curves = within_horizon_curves(p, mean, h)
            c = curves[:, :h].sum(axis=1)
            return Prediction(p_finish=1.0 - curves[:, h], c=c, survival=curves)
        return Prediction(p_finish=p, c=np.clip(p * mean + (1.0 - p) * h, min(1.0, h), h))

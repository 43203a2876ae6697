"""``gbdt``: LightGBM on causal features, ``c = p * E[r | r <= H] + (1 - p) * H``.

- a binary classifier for ``1{r <= H}`` and a regressor for ``r`` on finishing rows, both trained
  on :func:`balanceroute.features.causal.training_rows` snapshots with :func:`balanceroute.features.causal.snapshot_features`
  (which include the empirical survival and exactmatch answers at the snapshot's age, stacked);
  the rows weigh every request alike (``weighting = request``, the default) or each by its
  running time (``time-at-risk``: as a router meets it; docs/design.md, "What an estimator is
  judged on");
- at predict time the same features come from :class:`balanceroute.features.causal.OnlineHistory`, which
  ``observe()`` keeps up to date within a bounded window (train/serve parity is tested);
- probabilities are calibrated on the latest ``calib_fraction`` of training requests (held out of
  the boosters): ``isotonic``, ``platt`` or ``none``; all three are fitted, so the choice can be
  switched and compared after training (``calibration_report_`` holds the held-out ECEs); with
  ``refit_full`` the classifier is then retrained on every row, the latest included (the trace
  drifts, so the most recent requests are the most useful ones), keeping those calibrators;
- with ``platt`` and ``recalibrate``, ``observe()`` also scores each finished request at
  ``recal_ages`` random ages of its life *before* learning from it, and refits Platt's two
  parameters on the last ``recal_window`` such (score, outcome) pairs plus a sample of the
  calibration slice (:class:`balanceroute.predict.calibration.OnlineRecalibrator`): causal, bounded, and it
  follows drift in how often requests finish (the share finishing within H drifts on real
  traces);
- survival curves, and ``c`` with them (``curve``): the calibrated finishing mass ``p`` is spread
  over ``1..H`` like the recent outputs above the request's age (``marginal``, the default), like
  its key's outputs shrunk to the marginal (``key``), or as a truncated geometric whose mean
  matches the regressor's ``E[r | r <= H]`` (``geometric``); ``from_survival`` reproduces ``p``
  and ``c`` in every case. The geometric gives the best ``c`` as a point estimate, but its shape
  misplaces the near-term departures that BR-H's expected projection scores, which the
  empirical shapes place where the recent traffic says they fall (docs/design.md, "Estimators");
- prediction walks both boosters flattened to arrays (:class:`Forest`) in one compiled
  single-threaded loop, which gives LightGBM's raw scores exactly but several times faster than
  ``Booster.predict`` on router-sized batches, and is safe inside a server thread. The saved
  model keeps LightGBM's own model text (:meth:`GBDTEstimator.boosters` rebuilds the boosters)
  but no booster objects, so loading it to predict imports neither LightGBM nor scikit-learn.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Self

import numpy as np

from balanceroute.features.blend import blend_terms
from balanceroute.features.causal import (
    CausalConfig,
    trace_snapshot_features,
    training_rows,
)
from balanceroute.features.errors import UserError
from balanceroute.features.keys import AUTO_KEY, derive_keys, resolve_key_source
from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import (
    CompletedBatch,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.calibration import (
    expected_calibration_error,
    fit_platt_online,
    logit,
    platt_scaled,
    recalibration_snapshots,
    sigmoid,
)
from balanceroute.predict.curves import shaped_curves, within_horizon_curves
from balanceroute.predict.empirical import marginal_terms
from balanceroute.predict.forest import Forest
from balanceroute.predict.learned import LearnedEstimator, LearnedParams, check_weighting

if TYPE_CHECKING:
    import lightgbm as lgb
    import pandas as pd

CALIBRATIONS = ("isotonic", "platt", "none")
CURVES = ("geometric", "marginal", "key")
PRIOR_SAMPLE = 1024  # calibration-slice rows kept as the online recalibration's prior


@dataclass(frozen=True, slots=True)
class GBDTParams(LearnedParams):
    """The parameters of :class:`GBDTEstimator` (its constructor takes each by keyword)."""

    reg_estimators: int = field(default=40, metadata={"help": "regressor boosting rounds"})
    reg_learning_rate: float = field(default=0.12, metadata={"help": "regressor learning rate"})
    reg_num_leaves: int = field(default=15, metadata={"help": "regressor leaves per tree"})
    reg_max_depth: int = field(default=4, metadata={"help": "regressor tree depth"})
    max_rows: int = field(default=1_000_000, metadata={"help": "training rows at most"})
    calibration: str = field(default="platt", metadata={"help": "isotonic | platt | none"})
    curve: str = field(default="marginal", metadata={"help": "geometric | marginal | key"})
    weighting: str = field(
        default="request",
        metadata={
            "help": "training and recalibration rows weighted by each request's running time "
            "(time-at-risk: as a router meets it) or every request alike (request)"
        },
    )

    def __post_init__(self) -> None:
        check_weighting(self.weighting)
        if self.curve not in CURVES:
            raise UserError(f"unknown curve '{self.curve}'; known: {', '.join(CURVES)}")
        if self.calibration not in CALIBRATIONS:
            raise UserError(
                f"unknown calibration '{self.calibration}'; known: {', '.join(CALIBRATIONS)}"
            )


class GBDTEstimator(LearnedEstimator):
    """Calibrated LightGBM classifier + regressor on causal history features."""

    name = "gbdt"
    Params = GBDTParams

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Models saved before ``curve`` existed spread ``p`` as a geometric; those saved before
        ``weighting`` weighted requests alike."""
        state.setdefault("curve", "geometric")
        state.setdefault("weighting", "request")
        return state

    def check_fitted(self) -> None:
        super().check_fitted()
        if not hasattr(self, "forests_"):
            raise UserError(
                "this gbdt model was saved by an older version of balanceroute (no compiled "
                "forest, no stacked empirical features): retrain it with `balanceroute train`"
            )

    def _booster_params(self, objective: str) -> dict[str, Any]:
        params = self.classifier_params()
        if objective != "binary":
            params.update(
                objective=objective,
                learning_rate=self.reg_learning_rate,
                num_leaves=self.reg_num_leaves,
                max_depth=self.reg_max_depth,
                lambda_l2=0.0,
                feature_fraction=0.9,
            )
        return params

    def fit(self, history: pd.DataFrame) -> Self:
        import lightgbm as lgb

        if len(history) < 10:
            raise UserError(f"gbdt needs at least 10 requests to train, got {len(history)}")
        cfg = CausalConfig(
            assumed_tpot_s=self.assumed_tpot_s,
            window=self.window,
            horizon=self.horizon,
            cond_windows=tuple(min(w, self.window) for w in self.cond_windows),
        )
        arrays = to_arrays(history)
        req, age, weight = training_rows(
            arrays.output_tokens,
            step=self.step,
            per_request=self.per_request,
            max_rows=self.max_rows,
            seed=self.seed,
            at_risk=self.time_at_risk,
        )
        x = trace_snapshot_features(arrays, req, age, cfg)
        r = arrays.output_tokens[req] - age
        y = (r <= self.horizon).astype(np.float64)
        calib = req >= int(arrays.size * (1.0 - self.calib_fraction))
        if calib.all() or not calib.any():
            raise UserError("gbdt: too few requests to hold some out for calibration")
        fit = ~calib
        names = list(cfg.feature_names)
        classifier = lgb.train(
            self._booster_params("binary"),
            lgb.Dataset(x[fit], y[fit], weight=weight[fit], feature_name=names),
            num_boost_round=self.n_estimators,
        )
        fin = fit & (y > 0)
        regressor = lgb.train(
            self._booster_params("regression"),
            lgb.Dataset(x[fin], r[fin].astype(np.float64), weight=weight[fin], feature_name=names),
            num_boost_round=max(self.reg_estimators, 1),
        )
        self.forests_ = (Forest.from_booster(classifier), Forest.from_booster(regressor))
        self._fit_calibrators(x[calib], y[calib], weight[calib])
        if self.refit_full:
            classifier = lgb.train(
                self._booster_params("binary"),
                lgb.Dataset(x, y, weight=weight, feature_name=names),
                num_boost_round=self.n_estimators,
            )
            self.forests_ = (Forest.from_booster(classifier), self.forests_[1])
        self.booster_text_ = (classifier.model_to_string(), regressor.model_to_string())
        self.feature_names_ = names
        self.n_rows_ = int(x.shape[0])
        self.start_history(arrays, cfg)
        self.fitted_ = True
        return self

    def boosters(self) -> tuple[lgb.Booster, lgb.Booster]:
        """The fitted LightGBM classifier and regressor, rebuilt from their saved model text."""
        import lightgbm as lgb

        self.check_fitted()
        clf, reg = (lgb.Booster(model_str=text) for text in self.booster_text_)
        return clf, reg

    def _fit_calibrators(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        from sklearn.isotonic import IsotonicRegression

        raw = sigmoid(self.forests_[0].raw(x))
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        iso.fit(raw, y, sample_weight=w)
        platt, self.recalibrator_ = fit_platt_online(
            logit(raw),
            y,
            w,
            seed=self.seed,
            prior_sample=PRIOR_SAMPLE,
            window=self.recal_window,
            prior_weight=self.recal_prior,
        )
        self.calibrators_ = {
            "isotonic": (iso.X_thresholds_.copy(), iso.y_thresholds_.copy()),
            "platt": platt,
        }
        self.calibration_report_ = {
            f"calib_ece_{name}": expected_calibration_error(self._calibrate(raw, name), y, weight=w)
            for name in CALIBRATIONS
        }

    def _calibrate(self, raw: np.ndarray, how: str, *, online: bool = False) -> np.ndarray:
        """Calibrated probabilities from the classifier's probabilities ``raw``."""
        if how == "isotonic":
            xs, ys = self.calibrators_["isotonic"]
            return np.interp(raw, xs, ys)
        if how == "platt":
            recalibrator = self.recalibrator_ if online and self.recalibrate else None
            return platt_scaled(logit(raw), self.calibrators_["platt"], recalibrator)
        return raw

    def _recalibrate(self, done: CompletedBatch) -> None:
        snap = recalibration_snapshots(done, self.rng_, self.recal_window, self.recal_ages)
        x = self.history_.features(snap.now, snap.prompt_tokens, snap.age, snap.prompt_key)
        z = logit(sigmoid(self.forests_[0].raw(x)))
        y = (snap.remaining <= self.horizon).astype(np.float64)
        self.recalibrator_.add(z, y, self.length_weights(snap.age + snap.remaining))

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
        classifier, regressor = self.forests_
        raw = sigmoid(classifier.raw(x))
        p = np.clip(self._calibrate(raw, self.calibration, online=True), 0.0, 1.0)
        if self.curve != "geometric":
            return self._empirical_shape(batch, p, survival)
        mean = np.clip(regressor.raw(x), 1.0, h)
        if survival:
            curves = within_horizon_curves(p, mean, h)
            c = curves[:, :h].sum(axis=1)
            return Prediction(p_finish=1.0 - curves[:, h], c=c, survival=curves)
        return Prediction(p_finish=p, c=np.clip(p * mean + (1.0 - p) * h, min(1.0, h), h))

    def _empirical_shape(self, batch: RunningBatch, p: np.ndarray, survival: bool) -> Prediction:
        """``P(r > h) = 1 - p * F(h)``: the calibrated ``p`` spread over the horizon like the
        window's own outputs above the age (``marginal``) or the key's, shrunk to the marginal
        (``key``); where those have no mass within the horizon, like a uniform hazard."""
        h = self.horizon
        hist = self.history_
        win = hist.cfg.window
        age = np.asarray(batch.age, dtype=np.int64)
        mc = hist.marginal[win]
        # inside = sum_{j<H} S(a + j)
        s_a, s_b, inside = marginal_terms(mc, age, h)
        key_surv, bw = np.zeros((0, 0)), 1.0  # marginal: S_m alone
        if self.curve == "key":
            has_keys = batch.prompt_key is not None and bool(np.any(batch.prompt_key))
            src = resolve_key_source(AUTO_KEY, has_keys)
            keys = derive_keys(src, np.asarray(batch.prompt_tokens), batch.prompt_key)
            kc = hist.keyed[(src, win)]
            _, *k_terms = kc.query(keys, age, h)
            bw = hist.cfg.em_prior / max(mc.n, 1)
            s_a, s_b, inside = blend_terms((s_a, s_b, inside), tuple(k_terms), bw, 1.0)
            if survival:
                key_surv = kc.surv_matrix(keys, age, h)
        mass = s_a - s_b
        ok = mass > 0
        safe = np.where(ok, mass, 1.0)
        # sum_{j<H} F(j) with F(j) = (S(a) - S(a+j)) / mass; uniform hazard: (H - 1) / 2
        f_sum = np.where(ok, (h * s_a - inside) / safe, (h - 1) / 2.0)
        c = np.clip(h - p * f_sum, min(1.0, h), h)
        if not survival:
            return Prediction(p_finish=p, c=c)
        surv_table, _ = mc.curves()
        curves = shaped_curves(
            surv_table,
            age,
            h,
            key_surv,
            float(bw),
            np.ascontiguousarray(s_a, dtype=np.float64),
            np.ascontiguousarray(safe, dtype=np.float64),
            np.ascontiguousarray(ok),
            np.ascontiguousarray(p, dtype=np.float64),
        )
        return Prediction(p_finish=1.0 - curves[:, h], c=curves[:, :h].sum(axis=1), survival=curves)

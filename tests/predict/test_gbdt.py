"""gbdt internals: the compiled forest equals LightGBM, online recalibration is bounded and causal."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import CompletedBatch, RunningBatch
from balanceroute.predict.calibration import (
    OnlineRecalibrator,
    expected_calibration_error,
    fit_platt,
    sigmoid,
)
from balanceroute.predict.gbdt import GBDTEstimator
from balanceroute.predict.model_store import save_estimator
from tests.predict.conftest import FAST_PARAMS, HORIZON


def test_fit_platt_recovers_parameters():
    rng = np.random.default_rng(2)
    z = rng.normal(size=20_000) * 2
    y = (rng.random(z.size) < 1 / (1 + np.exp(-(0.7 * z - 0.4)))).astype(np.float64)
    a, b = fit_platt(z, y)
    assert a == pytest.approx(0.7, abs=0.05) and b == pytest.approx(-0.4, abs=0.05)


def test_online_recalibrator_is_bounded_and_follows_drift():
    rng = np.random.default_rng(3)
    prior_z = rng.normal(size=500)
    prior_y = (rng.random(500) < 1 / (1 + np.exp(-prior_z))).astype(np.float64)
    rec = OnlineRecalibrator((1.0, 0.0), prior_z, prior_y, np.ones(500), window=400)
    for _ in range(20):  # the world now finishes far less often than the scores say
        z = rng.normal(size=90)
        rec.add(z, (rng.random(90) < 1 / (1 + np.exp(-(z - 1.5)))).astype(np.float64))
    assert len(rec) == 400 and rec.z.size == 400
    assert rec.params[1] < -0.8  # the intercept moved most of the way to -1.5
    assert rec(np.zeros(1))[0] < 0.35


def test_ece_lives_in_predict_and_training_reexports_it():
    from balanceroute.training.metrics import expected_calibration_error as from_training

    assert from_training is expected_calibration_error


def test_observe_scores_before_learning_and_stays_bounded(small_trace):
    """Recalibration pairs come from the state before a completion is added; memory is fixed."""
    est = GBDTEstimator(horizon=HORIZON, recal_window=64, **FAST_PARAMS["gbdt"])
    est.fit(small_trace.iloc[:400])
    a = to_arrays(small_trace.iloc[400:])
    t = est.config_.finish_times(a)
    first = est.recalibrator_.params
    for lo in range(0, a.size, 25):
        sl = slice(lo, lo + 25)
        est.observe(
            CompletedBatch(a.prompt_tokens[sl], a.output_tokens[sl], a.prompt_key[sl], t[sl])
        )
    assert len(est.recalibrator_) == 64 and est.recalibrator_.z.size == 64
    assert est.recalibrator_.params != first
    batch = RunningBatch(a.prompt_tokens[:50], np.arange(50) % 9, a.prompt_key[:50])
    online = est.predict(batch).p_finish
    est.recalibrate = False
    static = est.predict(batch).p_finish
    assert np.all((online >= 0) & (online <= 1)) and not np.allclose(online, static)


def test_saved_model_keeps_lightgbm_text_and_loads_without_lightgbm(small_trace, tmp_path):
    """The artifact rebuilds LightGBM's boosters, yet predicting from it imports no LightGBM."""
    import subprocess
    import sys

    est = GBDTEstimator(horizon=HORIZON, **FAST_PARAMS["gbdt"]).fit(small_trace.iloc[:400])
    a = to_arrays(small_trace.iloc[400:])
    x = est.features(RunningBatch(a.prompt_tokens, a.output_tokens // 2, a.prompt_key))
    clf, reg = est.boosters()
    np.testing.assert_array_equal(clf.predict(x, raw_score=True), est.forests_[0].raw(x))
    np.testing.assert_array_equal(reg.predict(x, raw_score=True), est.forests_[1].raw(x))
    path = save_estimator(est, tmp_path / "gbdt.joblib")
    code = (
        "import sys, numpy as np\n"
        "from balanceroute.predict.base import RunningBatch\n"
        "from balanceroute.predict.model_store import load_file\n"
        f"est = load_file({str(path)!r})\n"
        "p = est.predict(RunningBatch(np.array([100, 900]), np.array([0, 7]), None))\n"
        "assert p.p_finish.shape == (2,)\n"
        "print(sorted(m for m in ('lightgbm', 'sklearn', 'scipy.signal') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=Path(__file__).parents[2],
    )
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("curve", ["marginal", "key", "geometric"])
def test_every_curve_is_a_survival_curve_consistent_with_p_and_c(small_trace, curve):
    """Whatever the shape, the curves start at 1, never rise, and give back p and c."""
    from balanceroute.predict.base import from_survival

    est = GBDTEstimator(horizon=HORIZON, curve=curve, **FAST_PARAMS["gbdt"])
    est.fit(small_trace.iloc[:400])
    a = to_arrays(small_trace.iloc[400:])
    ages = np.r_[np.zeros(50, dtype=np.int64), a.output_tokens[50:] // 2]
    ages[-1] = 10**6  # older than any output seen: no evidence, a uniform hazard
    batch = RunningBatch(a.prompt_tokens, ages, a.prompt_key)
    plain, full = est.predict(batch), est.predict(batch, survival=True)
    s = full.survival
    assert np.all(s[:, 0] == 1.0) and np.all(np.diff(s, axis=1) <= 1e-12)
    derived = from_survival(s)
    np.testing.assert_allclose(derived.p_finish, plain.p_finish, atol=1e-9)
    np.testing.assert_allclose(derived.c, full.c, atol=1e-9)
    np.testing.assert_allclose(plain.c, full.c, atol=1e-2)
    assert np.all((plain.c >= 1) & (plain.c <= HORIZON))


def test_unknown_curve_is_a_clear_error():
    from balanceroute.features.errors import UserError

    with pytest.raises(UserError, match="unknown curve 'wiggly'; known: geometric, marginal, key"):
        GBDTEstimator(curve="wiggly")


def test_marginal_curve_spreads_p_like_the_window_outputs(small_trace):
    """curve=marginal: P(r > h) = 1 - p (S(a) - S(a+h)) / (S(a) - S(a+H)), S the window counts."""
    est = GBDTEstimator(horizon=HORIZON, curve="marginal", **FAST_PARAMS["gbdt"])
    est.fit(small_trace.iloc[:400])
    a = to_arrays(small_trace.iloc[400:])
    ages = a.output_tokens // 3
    pred = est.predict(RunningBatch(a.prompt_tokens, ages, a.prompt_key), survival=True)
    counts = est.history_.marginal[est.history_.cfg.window]
    hs = np.arange(HORIZON + 1)
    s = counts.surv(ages[:, None] + hs[None, :])
    mass = s[:, 0] - s[:, -1]
    ok = mass > 0
    assert ok.mean() > 0.5
    want = 1.0 - pred.p_finish[ok, None] * (s[ok, :1] - s[ok]) / mass[ok, None]
    np.testing.assert_allclose(pred.survival[ok], want, atol=1e-12)


def test_the_calibration_sigmoid_is_silent_at_any_logit():
    """A logit of -1,000 once raised numpy's overflow warning: an unstamped line in a server's
    log on every reload."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        p = sigmoid(np.array([-1e4, -800.0, 0.0, 800.0, 1e4]))
    assert p[0] >= 0 and p[2] == 0.5 and p[-1] == 1.0 and np.all(np.diff(p) >= 0)

"""Live prediction quality: the outcome's definition, the window's scores (NaN without evidence),
the predictions at admission and the Prometheus gauges."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, generate_latest

from balanceroute.predict.base import CompletionEstimator, Fitting, Prediction, RunningBatch
from balanceroute.predict.live_quality import (
    LIVE_AUC,
    LIVE_BRIER,
    LIVE_CALIBRATION_ERROR,
    LIVE_QUALITY_METRICS,
    LIVE_REMAINING_ERROR,
    LIVE_WINDOW,
    NO_PREDICTION,
    PREDICTION_DRIFT,
    Admitted,
    LiveQuality,
    ModelIdentity,
    deployed,
    identity,
    stamp,
    window_scores,
)
from balanceroute.predict.remote import RemoteEstimator
from balanceroute.training.metrics import score


class Echo(CompletionEstimator):
    """Predicts ``p_finish = prompt_tokens / 1000`` and ``c = prompt_tokens / 100`` (a stub)."""

    name = "echo"
    fitting = Fitting.NONE

    def fit(self, history=None):
        self.fitted_ = True
        return self

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        t = batch.prompt_tokens.astype(np.float64)
        return Prediction(p_finish=t / 1000.0, c=t / 100.0)


def _stamped(version: str = "3", brier: float | None = 0.1) -> Echo:
    return stamp(Echo(horizon=10).fit(), "echo-model", version, {"brier": brier} if brier else {})


def test_the_outcome_counts_from_the_age_of_the_prediction_with_the_requests_own_length():
    a = Admitted(0.5, 5.0, horizon=10, age=0, model=ModelIdentity("m"))
    assert a.outcome(10) == (1.0, 10.0) and a.outcome(11) == (0.0, 10.0) and a.outcome(3) == (1, 3)
    later = Admitted(0.5, 5.0, horizon=10, age=4, model=ModelIdentity("m"))
    assert later.outcome(14) == (1.0, 10.0) and later.outcome(15) == (0.0, 10.0)


def test_window_scores_agree_with_trainings_metrics():
    rng = np.random.default_rng(0)
    r = rng.integers(1, 200, 500)
    p, c = rng.random(500), rng.uniform(1, 80, 500)
    y, m = (r <= 80).astype(float), np.minimum(r, 80).astype(float)
    live = window_scores(p, c, y, m, holdout_brier=0.2)
    offline = score(p, c, r, 80)
    assert live[LIVE_BRIER] == pytest.approx(offline["brier"])
    assert live[LIVE_CALIBRATION_ERROR] == pytest.approx(offline["ece"])
    assert live[LIVE_AUC] == pytest.approx(offline["auc"])
    assert live[LIVE_REMAINING_ERROR] == pytest.approx(offline["c_mae"])
    assert live[PREDICTION_DRIFT] == pytest.approx(offline["brier"] / 0.2)
    assert live[LIVE_WINDOW] == 500


def test_too_few_requests_or_one_class_give_nan_not_a_number_that_misleads():
    p = np.full(49, 0.5)
    few = window_scores(p, p, np.r_[np.zeros(20), np.ones(29)], p, 0.1)
    assert all(math.isnan(few[k]) for k in LIVE_QUALITY_METRICS) and few[LIVE_WINDOW] == 49
    p = np.full(60, 0.9)
    one = window_scores(p, np.ones(60), np.ones(60), np.ones(60), 0.1)
    assert all(math.isnan(one[k]) for k in (LIVE_BRIER, LIVE_CALIBRATION_ERROR, LIVE_AUC,
                                            PREDICTION_DRIFT))  # fmt: skip
    assert one[LIVE_REMAINING_ERROR] == 0.0  # the remaining error needs no second class
    no_holdout = window_scores(np.r_[np.zeros(30), np.ones(30)], p, np.r_[np.zeros(30),
                               np.ones(30)], p, None)  # fmt: skip
    assert no_holdout[LIVE_BRIER] == 0.0 and math.isnan(no_holdout[PREDICTION_DRIFT])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), min_size=50, max_size=300))
def test_brier_and_ece_lie_in_0_1_and_perfect_predictions_score_0(rows):
    p = np.array([r[0] for r in rows])
    y = np.array([float(r[1]) for r in rows])
    m = np.ones_like(p)
    s = window_scores(p, m, y, m, 0.25)
    if np.unique(y).size == 2:
        assert 0.0 <= s[LIVE_BRIER] <= 1.0 and 0.0 <= s[LIVE_CALIBRATION_ERROR] <= 1.0
        assert 0.0 <= s[LIVE_AUC] <= 1.0 and s[PREDICTION_DRIFT] == s[LIVE_BRIER] / 0.25
        perfect = window_scores(y, m, y, m, 0.25)
        assert perfect[LIVE_BRIER] == 0.0 and perfect[LIVE_CALIBRATION_ERROR] == 0.0
        assert perfect[LIVE_AUC] == 1.0 and perfect[PREDICTION_DRIFT] == 0.0
    else:
        assert math.isnan(s[LIVE_BRIER])


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(1, 40), min_size=1, max_size=80))
def test_the_window_keeps_only_the_last_n_finished(size, outputs):
    q = LiveQuality(window=size, min_finished=1)
    est = _stamped()
    for i, out in enumerate(outputs):
        q.admit(est, [i], np.array([10 * (i % 100) + 1]))
        assert q.finish(i, out)[3:] == ("echo-model", "3")
    ((key, values),) = q.scores().items()
    assert key == ("echo-model", "3") and values[LIVE_WINDOW] == min(size, len(outputs))
    kept = list(enumerate(outputs))[-size:]
    c = np.array([(10 * (i % 100) + 1) / 100 for i, _ in kept])
    m = np.array([min(o, 10) for _, o in kept], dtype=float)
    assert values[LIVE_REMAINING_ERROR] == pytest.approx(np.mean(np.abs(c - m)))


def test_admission_keeps_the_prediction_and_finish_writes_it_beside_the_outcome():
    q = LiveQuality(window=100)
    q.admit(_stamped(), ["a", "b"], np.array([200, 900]), np.array([1, 2], dtype=np.uint64))
    assert q.finish("a", 7) == (0.2, 2.0, 10, "echo-model", "3")
    assert q.finish("a", 7) == NO_PREDICTION  # once
    assert q.finish("never-admitted", 7) == NO_PREDICTION
    q.forget("b")
    assert q.finish("b", 3) == NO_PREDICTION
    q.admit(None, ["c"], np.array([5]))  # an arm without an estimator predicts nothing
    assert q.finish("c", 3) == NO_PREDICTION


def test_a_model_that_fails_at_admission_leaves_the_request_without_a_prediction():
    class Broken(Echo):
        def predict(self, batch, *, survival=False):
            raise RuntimeError("boom")

    q = LiveQuality()
    q.admit(Broken().fit(), [1], np.array([5]))
    assert q.finish(1, 3) == NO_PREDICTION and q.failures == 1


def test_identity_from_the_stamp_else_the_kind_and_the_estimators_holdout_brier():
    est = Echo().fit()
    assert identity(est) == ModelIdentity("echo", None, None)
    est.holdout_brier_ = 0.125  # what ``train`` saves with the estimator
    assert identity(est) == ModelIdentity("echo", None, 0.125)
    stamp(est, "m", "7")
    assert identity(est) == ModelIdentity("m", "7", 0.125)
    stamp(est, "m", "8", {"brier": 0.25})  # the registry's run metric wins
    assert identity(est).holdout_brier == 0.25


def test_the_deployed_model_behind_a_service_client_is_its_local_fallback():
    local = Echo().fit()
    remote = RemoteEstimator("http://127.0.0.1:9", fallback=local, timeout_s=0.01)
    assert deployed(remote) is local and deployed(local) is local


def test_the_gauges_are_exposed_per_model_version_with_nan_until_enough_finished():
    q = LiveQuality(window=1000, min_finished=50)
    registry = CollectorRegistry()
    registry.register(q)
    text = generate_latest(registry).decode()
    assert all(f"# TYPE {name} gauge" in text for name in (*LIVE_QUALITY_METRICS, LIVE_WINDOW))
    est = _stamped(brier=0.2)
    for i in range(200):  # prompts 1..1000 predict p = t / 1000; finish within H iff t > 500
        t = 5 * i + 1
        q.admit(est, [i], np.array([t]))
        q.finish(i, 5 if t > 500 else 50)
    text = generate_latest(registry).decode()
    labels = '{model="echo-model",version="3"}'
    assert f"{LIVE_WINDOW}{labels} 200.0" in text
    assert f"{LIVE_AUC}{labels} 1.0" in text
    values = q.scores()[("echo-model", "3")]
    assert 0 < values[LIVE_BRIER] < 0.25 and values[PREDICTION_DRIFT] == values[LIVE_BRIER] / 0.2

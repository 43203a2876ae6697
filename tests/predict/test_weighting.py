"""Row weighting of the LightGBM estimators: per request, or by time at risk (as a router meets
running requests)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.causal import training_rows
from balanceroute.features.errors import UserError
from balanceroute.predict import gbdt, hazard
from balanceroute.predict.base import CompletedBatch, RunningBatch
from balanceroute.predict.model_store import load_file, save_estimator
from balanceroute.predict.registry import make_estimator
from tests.predict.conftest import FAST_PARAMS, HORIZON

MODULES = {"gbdt": gbdt, "hazard": hazard}


def _two_lengths(n: int = 800, seed: int = 4) -> pd.DataFrame:
    """Half the requests finish in 4 tokens, half run 400, with nothing to tell them apart."""
    rng = np.random.default_rng(seed)
    out = np.where(rng.random(n) < 0.5, 4, 400)
    return pd.DataFrame(
        {
            "request_id": [f"r{i}" for i in range(n)],
            "arrival_s": np.arange(n) * 0.5,
            "prompt_tokens": rng.integers(100, 120, n),
            "output_tokens": out,
            "prompt_key": None,
        }
    )


def _fit(kind: str, weighting: str, trace: pd.DataFrame, **extra):
    params = {**FAST_PARAMS[kind], "weighting": weighting, "recalibrate": False, **extra}
    return make_estimator(kind, horizon=HORIZON, **params).fit(trace)


def _fresh(trace: pd.DataFrame, n: int = 50) -> RunningBatch:
    return RunningBatch(
        prompt_tokens=np.full(n, 110),
        age=np.zeros(n, dtype=np.int64),
        prompt_key=np.zeros(n, dtype=np.uint64),
        time_s=float(trace["arrival_s"].iloc[-1]),
    )


@pytest.mark.parametrize("kind", ["gbdt", "hazard"])
def test_time_at_risk_rows_weigh_requests_by_running_time(kind, monkeypatch):
    """The rows each option trains on: every request's total weight is its output length with
    time at risk, the same for every request per request."""
    trace = _two_lengths(300)
    seen = {}

    def spy(output_tokens, **kw):
        req, age, w = training_rows(output_tokens, **kw)
        seen["total"] = np.bincount(req, weights=w, minlength=len(output_tokens))
        return req, age, w

    monkeypatch.setattr(MODULES[kind], "training_rows", spy)
    out = trace["output_tokens"].to_numpy()
    _fit(kind, "time-at-risk", trace)
    np.testing.assert_allclose(seen["total"] / seen["total"].sum(), out / out.sum())
    _fit(kind, "request", trace)
    np.testing.assert_allclose(seen["total"], seen["total"][0])


@pytest.mark.parametrize("kind", ["gbdt", "hazard"])
def test_time_at_risk_predicts_departures_as_a_router_meets_them(kind):
    """Among requests aged 0 to 7 (the first cell of the age grid) a router meets each short
    request for 4 iterations and each long one for 8: a third of what it meets finishes within
    the horizon. Weighted per request, the short requests' single snapshot weighs as much as
    all of a long request's: the estimator says nearly every young request finishes soon."""
    trace = _two_lengths()
    rounds = {"n_estimators": 150}  # the hazard's rare events take more rounds than the tests'
    per_request = _fit(kind, "request", trace, **rounds).predict(_fresh(trace)).p_finish.mean()
    at_risk = _fit(kind, "time-at-risk", trace, **rounds).predict(_fresh(trace)).p_finish.mean()
    assert per_request > 0.8
    assert at_risk == pytest.approx(1 / 3, abs=0.12)


@pytest.mark.parametrize("kind", ["gbdt", "hazard"])
def test_both_weightings_train_learn_online_and_round_trip(kind, small_trace, tmp_path):
    for weighting in ("request", "time-at-risk"):
        est = make_estimator(kind, horizon=HORIZON, weighting=weighting, **FAST_PARAMS[kind])
        est.fit(small_trace.iloc[:400])
        tail = small_trace.iloc[400:]
        est.observe(
            CompletedBatch(
                prompt_tokens=tail["prompt_tokens"].to_numpy(),
                output_tokens=tail["output_tokens"].to_numpy(),
                time_s=tail["arrival_s"].to_numpy() + 1.0,
            )
        )
        batch = _fresh(small_trace)
        back = load_file(save_estimator(est, tmp_path / f"{kind}-{weighting}.joblib"))
        assert back.weighting == weighting
        np.testing.assert_array_equal(back.predict(batch).p_finish, est.predict(batch).p_finish)


def test_defaults_and_unknown_weighting():
    assert make_estimator("hazard").weighting == "time-at-risk"
    assert make_estimator("gbdt").weighting in ("request", "time-at-risk")
    with pytest.raises(UserError, match="weighting"):
        make_estimator("gbdt", weighting="uniform")
    with pytest.raises(UserError, match="weighting"):
        make_estimator("hazard", weighting="uniform")


def test_models_saved_before_the_option_keep_their_weighting():
    est = make_estimator("hazard")
    state = {k: v for k, v in est.__dict__.items() if k != "weighting"}
    old = est.__class__.__new__(est.__class__)
    old.__setstate__({**state, "at_risk": False})
    assert old.weighting == "request"
    g = make_estimator("gbdt")
    state = {k: v for k, v in g.__dict__.items() if k != "weighting"}
    old = g.__class__.__new__(g.__class__)
    old.__setstate__(state)
    assert old.weighting == "request"

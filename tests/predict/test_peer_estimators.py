"""The peers' predictors as estimators: ``osl-hint`` (Dynamo) and ``histogram`` (AIBrix)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletedBatch, RunningBatch, from_survival
from balanceroute.predict.histogram import HistogramEstimator, bucket_survival, log2_bucket
from balanceroute.predict.osl_hint import OslHintEstimator, client_hints
from balanceroute.predict.registry import make_estimator

H = 16


def _trace(outputs, prompts=None, hints=None) -> pd.DataFrame:
    n = len(outputs)
    frame = pd.DataFrame(
        {
            "request_id": [str(i) for i in range(n)],
            "arrival_s": np.arange(n, dtype=np.float64),
            "prompt_tokens": np.asarray(prompts if prompts is not None else [100] * n),
            "output_tokens": np.asarray(outputs),
            "prompt_key": [None] * n,
        }
    )
    if hints is not None:
        frame["output_hint"] = hints
    return frame


def _batch(prompts, ages, index=None) -> RunningBatch:
    ages = np.asarray(ages, dtype=np.int64)
    return RunningBatch(
        prompt_tokens=np.asarray(prompts, dtype=np.int64),
        age=ages,
        request_index=None if index is None else np.asarray(index, dtype=np.int64),
    )


def test_both_are_registered_by_name():
    assert isinstance(make_estimator("osl-hint"), OslHintEstimator)
    assert isinstance(make_estimator("histogram"), HistogramEstimator)


# --- osl-hint ---------------------------------------------------------------------------------


def test_osl_hint_with_sigma_zero_is_the_oracle():
    est = OslHintEstimator(horizon=H, sigma=0.0).fit(_trace([5, 40, 17]))
    pred = est.predict(_batch([1, 1, 1], [0, 0, 3], [0, 1, 2]), survival=True)
    np.testing.assert_array_equal(pred.p_finish, [1.0, 0.0, 1.0])
    np.testing.assert_array_equal(pred.c, [5.0, 16.0, 14.0])
    derived = from_survival(pred.survival)
    np.testing.assert_array_equal(derived.c, pred.c)


def test_osl_hint_reads_the_trace_column_and_decays_like_dynamo():
    est = OslHintEstimator(horizon=H, sigma=3.0).fit(_trace([5, 5], hints=[30, 10]))
    pred = est.predict(_batch([1, 1, 1], [0, 20, 12], [0, 0, 1]))
    # hint 30 at age 0: 30 left; at age 20: 10 left; hint 10 passed at age 12: at least 1 left
    np.testing.assert_array_equal(pred.c, [16.0, 10.0, 1.0])
    np.testing.assert_array_equal(pred.p_finish, [0.0, 1.0, 1.0])


def test_osl_hint_refuses_bad_hints_and_parameters():
    with pytest.raises(UserError, match=r"output_hint.*row 2"):
        OslHintEstimator().fit(_trace([5, 5], hints=[3, 0]))
    with pytest.raises(UserError, match="sigma"):
        OslHintEstimator(sigma=-1.0)
    with pytest.raises(UserError, match="request_index"):
        OslHintEstimator().fit(_trace([5])).predict(_batch([1], [0]))


def test_client_hints_are_lognormal_around_the_truth():
    out = np.full(20_000, 200)
    logs = np.log(client_hints(out, 0.7, seed=1) / 200)
    assert abs(logs.mean()) < 0.02 and abs(logs.std() - 0.7) < 0.02
    np.testing.assert_array_equal(client_hints(out, 0.7, 1), client_hints(out, 0.7, 1))


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.lists(st.integers(1, 3000), min_size=1, max_size=20),
    sigma=st.floats(0.0, 2.0),
    age=st.integers(0, 4000),
    horizon=st.integers(1, 120),
)
def test_osl_hint_properties(outputs, sigma, age, horizon):
    est = OslHintEstimator(horizon=horizon, sigma=sigma, seed=2).fit(_trace(outputs))
    idx = np.arange(len(outputs))
    young = est.predict(_batch(outputs, np.full(idx.size, age), idx), survival=True)
    old = est.predict(_batch(outputs, np.full(idx.size, age + 7), idx))
    assert np.all((young.p_finish >= 0) & (young.p_finish <= 1))
    assert np.all((young.c >= 0) & (young.c <= horizon))
    # older requests are no less likely to finish and have no more left
    assert np.all(old.p_finish >= young.p_finish) and np.all(old.c <= young.c)
    assert np.all(np.diff(young.survival, axis=1) <= 0)


# --- histogram --------------------------------------------------------------------------------


def test_log2_buckets_and_their_survival():
    np.testing.assert_array_equal(
        log2_bucket(np.array([1, 2, 3, 4, 1023, 1024]), 30), [0, 1, 1, 2, 9, 10]
    )
    s = bucket_survival(np.array([0, 4, 6, 7]), 4)
    # bucket 2 holds 4..7 uniformly: P(O > 4) = 3/4, P(O > 6) = 1/4, P(O > 7) = 0
    np.testing.assert_allclose(s[:, 2], [1.0, 0.75, 0.25, 0.0])


def test_histogram_follows_the_prompt_row():
    short = [3] * 50  # prompts of 100 tokens answer in 2..3 tokens
    long = [60] * 50  # prompts of 5,000 tokens answer in 32..63
    est = HistogramEstimator(horizon=H, min_count=4).fit(
        _trace(short + long, prompts=[100] * 50 + [5000] * 50)
    )
    pred = est.predict(_batch([100, 5000], [0, 0]))
    assert pred.p_finish[0] == pytest.approx(1.0)
    assert pred.p_finish[1] == pytest.approx(0.0)
    assert pred.c[0] < 4 and pred.c[1] == pytest.approx(H)


def test_histogram_window_forgets_and_unseen_rows_use_every_prompt():
    est = HistogramEstimator(horizon=H, window=10, min_count=4).fit(_trace([3] * 10))
    est.observe(CompletedBatch(np.full(10, 100), np.full(10, 500)))
    assert est.counts_.sum() == 10
    pred = est.predict(_batch([100, 7], [0, 0]))  # 7 tokens: an empty row, pooled answer
    np.testing.assert_allclose(pred.p_finish, [0.0, 0.0])


def test_histogram_past_every_length_projects_survival():
    est = HistogramEstimator(horizon=H).fit(_trace([3] * 20))
    pred = est.predict(_batch([100], [50]), survival=True)
    np.testing.assert_array_equal(pred.survival, np.ones((1, H + 1)))


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.lists(st.integers(1, 5000), min_size=1, max_size=40),
    prompts=st.lists(st.integers(1, 100_000), min_size=1, max_size=8),
    ages=st.lists(st.integers(0, 6000), min_size=1, max_size=8),
    horizon=st.integers(1, 120),
)
def test_histogram_properties(outputs, prompts, ages, horizon):
    rng = np.random.default_rng(len(outputs))
    trace = _trace(outputs, prompts=rng.choice(prompts, len(outputs)))
    est = HistogramEstimator(horizon=horizon, min_count=2).fit(trace)
    n = min(len(prompts), len(ages))
    pred = est.predict(_batch(prompts[:n], ages[:n]), survival=True)
    s = pred.survival
    assert np.all((pred.p_finish >= 0) & (pred.p_finish <= 1))
    assert np.all((pred.c >= 1 - 1e-9) & (pred.c <= horizon + 1e-9))
    assert np.all(s[:, 0] == 1.0) and np.all(np.diff(s, axis=1) <= 1e-12)
    # a longer horizon never makes finishing within it less likely
    wider = HistogramEstimator(horizon=horizon + 5, min_count=2).fit(trace)
    assert np.all(wider.predict(_batch(prompts[:n], ages[:n])).p_finish >= pred.p_finish - 1e-9)

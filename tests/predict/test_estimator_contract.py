"""One set of checks run over every registered estimator."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.features.limits import input_limits
from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import NotFittedError, RunningBatch, from_survival
from balanceroute.predict.model_store import load_file, save_estimator
from balanceroute.predict.registry import estimator_names, make_estimator
from tests.predict.conftest import FAST_PARAMS, HORIZON

# ``posterior`` reads a template preset's catalogue: its checks run on its own preset
# (tests/predict/test_posterior.py)
NAMES = [n for n in estimator_names() if n != "posterior"]


def _make(name: str):
    return make_estimator(name, horizon=HORIZON, **FAST_PARAMS.get(name, {}))


def _batch(trace, n: int = 200, seed: int = 0) -> RunningBatch:
    arrays = to_arrays(trace)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arrays.size, n)
    age = np.floor(rng.random(n) * arrays.output_tokens[idx]).astype(np.int64)
    return RunningBatch(
        prompt_tokens=arrays.prompt_tokens[idx],
        age=age,
        prompt_key=arrays.prompt_key[idx],
        request_index=idx,
        time_s=float(arrays.arrival_s[-1]),
    )


@pytest.fixture(scope="module", params=NAMES)
def fitted(request, small_trace):
    return request.param, _make(request.param).fit(small_trace)


def test_learned_estimators_are_registered():
    assert {"survival", "exactmatch", "gbdt", "oracle", "none"} <= set(NAMES)


def test_shapes_and_ranges(fitted, small_trace):
    _, est = fitted
    batch = _batch(small_trace)
    pred = est.predict(batch)
    assert pred.p_finish.shape == pred.c.shape == (batch.size,)
    assert np.all((pred.p_finish >= 0) & (pred.p_finish <= 1))
    assert np.all((pred.c >= 1) & (pred.c <= HORIZON))
    assert pred.survival is None


def test_survival_curves(fitted, small_trace):
    name, est = fitted
    if not est.provides_survival:
        pytest.skip(f"{name} gives no survival curves")
    batch = _batch(small_trace)
    pred = est.predict(batch, survival=True)
    s = pred.survival
    assert s.shape == (batch.size, HORIZON + 1)
    assert np.all(s[:, 0] == 1.0)
    assert np.all(np.diff(s, axis=1) <= 1e-12)
    assert np.all((s >= 0) & (s <= 1))
    derived = from_survival(s)
    np.testing.assert_allclose(pred.p_finish, derived.p_finish, atol=1e-9)
    np.testing.assert_allclose(pred.c, derived.c, atol=1e-9)
    plain = est.predict(batch)
    np.testing.assert_allclose(plain.p_finish, pred.p_finish, atol=1e-9)
    np.testing.assert_allclose(plain.c, pred.c, atol=1e-2)


def test_save_load_round_trip(fitted, small_trace, tmp_path):
    name, est = fitted
    batch = _batch(small_trace, seed=1)
    path = save_estimator(est, tmp_path / f"{name}.joblib")
    again = load_file(path)
    a, b = est.predict(batch), again.predict(batch)
    np.testing.assert_array_equal(a.p_finish, b.p_finish)
    np.testing.assert_array_equal(a.c, b.c)


@pytest.mark.parametrize("name", NAMES)
def test_predict_before_fit_raises(name, small_trace):
    est = _make(name)
    if name == "none":
        pytest.skip("'none' needs no fit")
    with pytest.raises(NotFittedError):
        est.predict(_batch(small_trace, n=5))


@pytest.mark.parametrize("name", NAMES)
def test_fit_returns_self_and_empty_batch(name, small_trace):
    est = _make(name)
    assert est.fit(small_trace) is est
    empty = RunningBatch(
        np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.uint64), np.zeros(0, np.int64)
    )
    pred = est.predict(empty)
    assert pred.p_finish.shape == (0,)


def test_sizes_at_the_input_limits_give_valid_curves(fitted, small_trace):
    """The largest accepted prompt and age (features/limits.py) stay inside the estimators'
    bounded tables (keyed composites, histograms): valid curves, no overflow."""
    _, est = fitted
    lim = input_limits()
    batch = _batch(small_trace, n=4, seed=2)
    batch = RunningBatch(
        prompt_tokens=np.array([1, lim.max_prompt_tokens, 1, lim.max_prompt_tokens]),
        age=np.array([0, 0, lim.max_output_tokens - 1, lim.max_output_tokens - 1]),
        prompt_key=batch.prompt_key,
        request_index=batch.request_index,
        time_s=batch.time_s,
    )
    pred = est.predict(batch, survival=est.provides_survival)
    assert np.all(np.isfinite(pred.p_finish)) and np.all(
        (pred.p_finish >= 0) & (pred.p_finish <= 1)
    )
    assert np.all((pred.c >= 1) & (pred.c <= HORIZON))
    if est.provides_survival:
        assert np.all(np.diff(pred.survival, axis=1) <= 1e-12)

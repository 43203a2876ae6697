"""Cached curves advanced by age: the compiled projection against its numpy definition, and the
consistency of conditioning with the estimators that are ratios of one survival function."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import RunningBatch
from balanceroute.predict.incremental import CurveCache, conditioned_loads
from balanceroute.predict.projection import request_paths
from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.policies.balance_config import BRH_DEFAULTS
from tests.router.helpers import frame


def reference_loads(rows, ages, workers, workloads, curves, pred_age, known, refill, g):
    """The numpy definition: each curve conditioned on survival to its age (held at its last
    value beyond H), clipped, 1 at h = 0, then the paths of ``request_paths`` summed by worker."""
    h1 = curves.shape[1]
    out = np.zeros((g, h1))
    for i, r in enumerate(rows):
        s = np.ones(h1)
        if known[r]:
            d = min(max(ages[i] - pred_age[r], 0), h1 - 1)
            ext = np.concatenate([curves[r], np.full(h1, curves[r, -1])])
            if ext[d] > 0:
                s = np.clip(ext[d : d + h1] / ext[d], 0.0, 1.0)
                s[0] = 1.0
        path = request_paths(np.array([workloads[i]]), s[None, :], None if refill < 0 else refill)
        out[workers[i]] += path[0]
    return out


@settings(max_examples=60, deadline=None)
@given(
    n=st.integers(0, 30),
    h=st.integers(1, 12),
    g=st.integers(1, 4),
    refill=st.sampled_from([-1.0, 0.0, 350.0]),
    seed=st.integers(0, 2**31),
)
def test_conditioned_loads_kernel_equals_its_definition(n, h, g, refill, seed):
    rng = np.random.default_rng(seed)
    curves = np.sort(rng.random((n, h + 1)), axis=1)[:, ::-1].copy()
    curves[:, 0] = 1.0
    curves[rng.random(n) < 0.2, 1:] = 0.0  # outlived their curve
    pred_age = rng.integers(0, 50, n)
    ages = pred_age + rng.integers(-1, 2 * h, n)
    known = rng.random(n) < 0.8
    rows = rng.permutation(n)
    args = (
        rows,
        ages[rows],
        rng.integers(0, g, n),
        rng.integers(1, 5000, n).astype(np.float64),
        curves,
        pred_age,
        known,
        refill,
        g,
    )
    np.testing.assert_allclose(conditioned_loads(*args), reference_loads(*args), atol=1e-7)


def test_survival_is_exactly_consistent_with_conditioning():
    """survival's curve at age a + d is its curve at age a conditioned on living to d."""
    rng = np.random.default_rng(3)
    est = SurvivalEstimator(horizon=20).fit(
        frame(rng.integers(1, 900, 500), rng.integers(1, 60, 500))
    )
    a, d = np.array([3, 10, 25]), 4
    at_a = est.predict(RunningBatch(np.ones(3, np.int64), a), survival=True).survival
    later = est.predict(RunningBatch(np.ones(3, np.int64), a + d), survival=True).survival
    ext = np.concatenate([at_a, np.repeat(at_a[:, -1:], d, axis=1)], axis=1)
    alive = ext[:, d] > 0
    cond = ext[alive, d : d + 21] / ext[alive, d : d + 1]
    np.testing.assert_allclose(cond[:, : 21 - d], later[alive, : 21 - d], rtol=1e-12)


def test_cache_rows_are_reused_and_bounded():
    cache = CurveCache(horizon=3, n_requests=100)
    rows = cache.rows(np.array([5, 7, 9]))
    assert sorted(rows.tolist()) == [0, 1, 2] and cache.rows_in_use == 3
    assert cache.stale(rows, 0, 4).all()  # nothing predicted yet
    cache.store(rows, np.ones((3, 4)), np.zeros(3, np.int64), k=10)
    assert not cache.stale(rows, 13, 4).any() and cache.stale(rows, 14, 4).all()
    np.testing.assert_array_equal(cache.rows(np.array([7, 5])), rows[[1, 0]])
    cache.release(np.array([5, 9]))
    assert cache.rows_in_use == 1
    again = cache.rows(np.array([11, 12]))  # freed rows come back, unknown
    assert set(again.tolist()) == {int(rows[0]), int(rows[2])}
    assert cache.stale(again, 10, 4).all()
    assert cache.known.shape[0] == 3  # no growth while freed rows remain


@pytest.mark.parametrize("d", [0, 1, 4, 8, BRH_DEFAULTS.repredict - 1])
def test_hazard_curves_advanced_by_age_track_its_repredictions(hazard_40, d):
    """hazard's curve depends on the age through its features and bins, so an advanced curve is
    an approximation, which BR-H keeps for fewer than ``repredict`` iterations: over that span
    it stays close to what hazard answers afresh (exactly equal at d = 0), in the discounted
    mean over the offsets both curves know."""
    est, batch, h = hazard_40
    at_a = est.predict(batch, survival=True).survival
    later = RunningBatch(batch.prompt_tokens, batch.age + d, prompt_key=batch.prompt_key)
    fresh = est.predict(later, survival=True).survival
    cache = CurveCache(horizon=h, n_requests=batch.size)
    rows = cache.rows(np.arange(batch.size))
    cache.store(rows, at_a, batch.age, k=0)
    advanced = np.array(  # each request's advanced curve: its projected path, W = 0, no refill
        [
            conditioned_loads(
                rows[i : i + 1],
                batch.age[i : i + 1] + d,
                np.zeros(1, np.int64),
                np.zeros(1),
                cache.curves,
                cache.pred_age,
                cache.known,
                -1.0,
                1,
            )[0]
            / np.arange(h + 1).clip(1)
            for i in range(batch.size)
        ]
    )
    advanced[:, 0] = 1.0
    known = slice(1, h + 1 - d)  # offsets beyond H - d are held at S(H): nothing is known there
    w = BRH_DEFAULTS.gamma ** np.arange(1, h + 1 - d)
    gap = np.abs(advanced[:, known] - fresh[:, known]) @ w / w.sum()
    if d == 0:
        np.testing.assert_allclose(advanced, at_a, atol=1e-12)
    assert gap.mean() < 0.05
    assert np.all(np.diff(advanced, axis=1) <= 1e-12)  # still a survival curve


@pytest.fixture(scope="module")
def hazard_40():
    """hazard (H = 40) fitted on a seeded Mooncake-like trace, and running requests of it."""
    from balanceroute.features.synthetic import generate
    from balanceroute.predict.registry import make_estimator

    h = 40
    trace = generate("mooncake-conv", 1500, seed=3)
    est = make_estimator(
        "hazard", horizon=h, n_estimators=30, min_data_in_leaf=20, num_threads=1
    ).fit(trace)
    arrays = to_arrays(trace)
    rng = np.random.default_rng(0)
    idx = rng.choice(arrays.size, 300, replace=False)
    batch = RunningBatch(
        arrays.prompt_tokens[idx],
        (rng.random(idx.size) * arrays.output_tokens[idx]).astype(np.int64),
        prompt_key=arrays.prompt_key[idx],
    )
    return est, batch, h


@pytest.mark.parametrize("kind", ["survival", "exactmatch", "gbdt", "hazard"])
def test_incremental_replay_predicts_fewer_rows_and_frees_its_cache(kind):
    from balanceroute.predict.registry import make_estimator
    from balanceroute.router.lab.simulator import SimConfig, simulate
    from balanceroute.router.policies.balance_route import BRHPolicy
    from tests.router.helpers import released

    rng = np.random.default_rng(1)
    history = frame(rng.integers(50, 3000, 400), rng.integers(1, 200, 400))
    prompts, outputs = rng.integers(50, 3000, 300), rng.integers(1, 200, 300)
    learned = kind in ("gbdt", "hazard")
    params = {"n_estimators": 5, "per_request": 4, "min_data_in_leaf": 20} if learned else {}
    est = make_estimator(kind, horizon=16, **params).fit(history)
    pol = BRHPolicy(estimator=est, horizon=16, guard=False)
    res = simulate(released(prompts, outputs), pol, SimConfig(workers=3, slots=6))
    stats = res.extras
    assert stats["predicted_rows"] < res.iterations * 3 * 6  # not every running request each time
    assert pol.cache.rows_in_use == 0  # every finished request gave its row back
    assert pol.cache.known.shape[0] <= 2 * 3 * 6  # rows grow by doubling, at most twice the slots

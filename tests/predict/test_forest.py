"""The flattened forest against LightGBM itself: every scorer gives the booster's raw scores."""

from __future__ import annotations

from dataclasses import replace

import lightgbm as lgb
import numpy as np
import pytest

from balanceroute.predict.forest import Forest


def _data(n: int = 3000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, 6))
    x[rng.random(x.shape) < 0.15] = np.nan  # missing values on every feature
    x[:, 5] = np.where(rng.random(n) < 0.3, 0.0, x[:, 5])  # exact zeros too
    y = np.nan_to_num(x[:, 0]) + 0.5 * np.nan_to_num(x[:, 1]) + rng.normal(size=n) > 0
    return x, y.astype(np.float64)


@pytest.mark.parametrize(
    "params",
    [
        {"objective": "binary", "num_leaves": 8, "max_depth": 3},  # heap layout
        {"objective": "binary", "num_leaves": 31},  # deep trees: generic walk
        {"objective": "regression", "num_leaves": 15, "max_depth": 4},
        {"objective": "binary", "num_leaves": 64, "max_depth": 6},  # widest bitmask
        {"objective": "binary", "num_leaves": 100, "max_depth": 7},  # heap, no bitmask
        {"objective": "binary", "num_leaves": 8, "max_depth": 3, "zero_as_missing": True},
        {"objective": "binary", "num_leaves": 8, "use_missing": False},
    ],
)
def test_forest_reproduces_lightgbm_raw_scores(params):
    x, y = _data()
    booster = lgb.train(
        {**params, "min_data_in_leaf": 20, "verbose": -1, "num_threads": 1, "seed": 0},
        lgb.Dataset(x, y),
        num_boost_round=25,
    )
    forest = Forest.from_booster(booster)
    if "max_depth" in params:  # shallow: the heap layout, unless zero counts as missing
        assert (forest.heap_leaf is not None) == (not params.get("zero_as_missing"))
    if params.get("num_leaves") == 31:
        assert forest.heap_leaf is None
    probe, _ = _data(777, seed=1)
    probe[:5] = np.nan
    probe[5:10] = 0.0
    want = booster.predict(probe, raw_score=True)
    np.testing.assert_array_equal(forest.raw(probe), want)
    np.testing.assert_array_equal(forest.raw(np.asfortranarray(probe)), want)
    if forest.heap_leaf is not None:
        assert (forest.leaf_mask is not None) == (forest.depth <= 6)
        heap = replace(forest, leaf_mask=None)  # the heap descent on the same trees
        np.testing.assert_array_equal(heap.raw(probe), want)
    generic = replace(forest, heap_leaf=None, leaf_mask=None)  # the node-walk kernel
    np.testing.assert_array_equal(generic.raw(probe), want)


@pytest.mark.parametrize("group", [1, 7, 12])
@pytest.mark.parametrize("depth", [3, 6, 7])
def test_grouped_scorer_equals_the_rows_written_out(group, depth):
    """Rows in groups sharing their first features score as the full rows do, bit for bit
    (shared splits tested once per group; deep forests fall back to the full rows)."""
    x, y = _data(4000, seed=2)
    booster = lgb.train(
        {"objective": "binary", "num_leaves": 2**depth, "max_depth": depth, "verbose": -1},
        lgb.Dataset(x, y, params={"min_data_in_leaf": 20, "num_threads": 1}),
        num_boost_round=30,
    )
    forest = Forest.from_booster(booster)
    probe, _ = _data(12 * 701, seed=3)
    n = 701
    shared = probe[:n, :4]
    own = probe[: n * group, 4:]
    full = np.concatenate([np.repeat(shared, group, axis=0), own], axis=1)
    want = booster.predict(full, raw_score=True)
    np.testing.assert_array_equal(forest.raw_grouped(shared, own), want)
    np.testing.assert_array_equal(forest.raw(full), want)

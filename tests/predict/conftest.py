"""Shared fixtures: a small seeded synthetic trace and fast estimator settings."""

from __future__ import annotations

import pandas as pd
import pytest

from balanceroute.features.synthetic import generate

HORIZON = 16
FAST_PARAMS = {
    "gbdt": {"n_estimators": 15, "min_data_in_leaf": 20, "num_threads": 1},
    "hazard": {"n_estimators": 15, "min_data_in_leaf": 20, "num_threads": 1, "bins": 6},
}


@pytest.fixture(scope="session")
def small_trace() -> pd.DataFrame:
    """600 requests with prompt keys (Mooncake-like) so every key source has something."""
    return generate("mooncake-conv", 600, seed=3)

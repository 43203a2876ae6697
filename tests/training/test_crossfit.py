"""Cross-fitting for the twin's prior: the folds partition the history in time, every fold is
replayed only by a copy fitted without it, and the pooled prior counts its overlap per fold."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.errors import UserError
from balanceroute.predict.exactmatch import ExactMatchEstimator
from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.lab.twin.prior import PriorConfig
from balanceroute.router.lab.twin.prior_measure import measure_folds, measure_prior
from balanceroute.training.crossfit import fitted_folds, time_folds
from tests.router.helpers import frame

CFG = TwinConfig(block_requests=36)
SHAPE = PriorConfig(workers=3, slots=6, windows=8)


def _trace(n: int = 240, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(100, 3000, n)
    out = frame(
        prompts,
        rng.integers(1, 120, n),
        np.sort(rng.uniform(0, 100, n)),
        keys=[f"k{p % 50}" for p in prompts],
    )
    out["request_id"] = [f"r{i}" for i in range(n)]
    return out.sample(frac=1.0, random_state=seed).reset_index(drop=True)  # not in time order


@settings(max_examples=40, deadline=None)
@given(n=st.integers(4, 120), k=st.integers(2, 8), seed=st.integers(0, 10))
def test_folds_partition_the_history_in_time(n, k, seed):
    trace = _trace(n, seed)
    if n < 2 * k:
        with pytest.raises(UserError, match="too few"):
            time_folds(trace, k)
        return
    folds = time_folds(trace, k)
    ids = set(trace["request_id"])
    seen: list[str] = []
    for fit, replay in folds:
        assert set(fit["request_id"]).isdisjoint(replay["request_id"])
        assert set(fit["request_id"]) | set(replay["request_id"]) == ids
        assert len(fit) + len(replay) == n and len(replay) >= n // k
        seen += list(replay["request_id"])
    assert sorted(seen) == sorted(ids)  # every request is replayed exactly once
    bounds = [(r["arrival_s"].min(), r["arrival_s"].max()) for _, r in folds]
    assert all(a[1] <= b[0] for a, b in itertools.pairwise(bounds))


def test_every_fold_is_replayed_by_a_copy_that_never_saw_it():
    trace = _trace(480)
    fitted_on: list[set[str]] = []

    def fit(part: pd.DataFrame) -> ExactMatchEstimator:
        fitted_on.append(set(part["request_id"]))
        return ExactMatchEstimator(horizon=16).fit(part)

    pairs = fitted_folds(fit, time_folds(trace, 3))
    for ids, (_, replay) in zip(fitted_on, pairs, strict=True):
        assert ids.isdisjoint(replay["request_id"])
    prior = measure_folds(pairs, SHAPE, CFG)
    assert prior.folds == 3 and prior.holdout_requests == len(trace)
    assert prior.holdout_first_arrival_s == trace["arrival_s"].min()
    # a copy that had seen its fold (it memorises outputs by key) would give other evidence:
    # the windows replay the fold and nothing the honest copy was fitted on
    leaked = [
        (copy.deepcopy(est).fit(pd.concat([replay, replay])), replay) for est, replay in pairs
    ]
    assert measure_folds(leaked, SHAPE, CFG).mean_log_ratio != prior.mean_log_ratio


def test_the_pooled_prior_counts_the_overlap_per_fold_and_pools_the_windows():
    trace = _trace(480)
    folds = time_folds(trace, 2)
    est = SurvivalEstimator(horizon=16).fit(_trace(200, seed=9))
    pairs = [(copy.deepcopy(est), replay) for _, replay in folds]
    pooled = measure_folds(pairs, SHAPE, CFG)
    per_fold = [
        measure_prior(copy.deepcopy(est), r, PriorConfig(3, 6, windows=4), CFG)
        for r in (folds[0][1], folds[1][1])
    ]
    assert pooled.windows == 8 and all(p.windows == 4 for p in per_fold)
    # each fold's 4 windows cover its own 240 requests: the overlap is theirs, not 8 windows' over 240
    assert pooled.overlap == pytest.approx(4 * 36 / 240, abs=1e-4)
    assert pooled.overlap == pytest.approx(per_fold[0].overlap, abs=1e-4)
    means = [p.mean_log_ratio[2] for p in per_fold]
    assert pooled.mean_log_ratio[2] == pytest.approx(np.mean(means), abs=1e-5)


def test_a_fold_shorter_than_a_block_adds_no_windows_and_says_so():
    trace = _trace(300)
    est = SurvivalEstimator(horizon=16).fit(_trace(200, seed=9))
    short = trace.sort_values("arrival_s").iloc[:20]
    rest = trace.sort_values("arrival_s").iloc[20:]
    prior = measure_folds([(copy.deepcopy(est), rest), (copy.deepcopy(est), short)], SHAPE, CFG)
    assert prior.windows == 4 and "1 fold(s) shorter than a block of 36" in prior.note
    none = measure_folds([(copy.deepcopy(est), short)], SHAPE, CFG)
    assert none.windows == 0 and none.start_weight == 0.0

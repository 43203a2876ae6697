"""The do-no-harm guard: its kernels against their definitions, its verdicts, and where BR-H
uses it (stepping aside is exactly brh:none)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.oracle import OracleEstimator
from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies import guard as guard_module
from balanceroute.router.policies.balance_route import BRHPolicy, PaperBRHPolicy
from balanceroute.router.policies.guard import (
    MIN_SNAPSHOTS,
    ProjectionGuard,
    decision_loss,
    departures_into,
)
from tests.router.helpers import frame, released


@settings(max_examples=50, deadline=None)
@given(
    h=st.integers(1, 10),
    g=st.integers(1, 4),
    n=st.integers(0, 12),
    refill=st.sampled_from([-1.0, 0.0, 800.0]),
    seed=st.integers(0, 2**31),
)
def test_departures_kernel_equals_its_definition(h, g, n, refill, seed):
    rng = np.random.default_rng(seed)
    cap = 3
    k0 = np.array([10, 14, 18])
    live = np.array([True, False, True])
    refills = np.full(cap, refill)
    workers = rng.integers(0, g, n)
    prompts = rng.integers(1, 3000, n).astype(float)
    admitted = rng.integers(0, 20, n)
    k = int(rng.integers(11, 30))
    taken = np.zeros((cap, g, h + 1))
    departures_into(k0, refills, live, taken, np.arange(h + 1.0), workers, prompts, admitted, k)
    want = np.zeros_like(taken)
    for j in range(cap):
        r = k - k0[j]
        if not live[j] or not 1 <= r <= h:
            continue
        for i in range(n):
            if admitted[i] >= k0[j]:
                continue  # not running at the snapshot
            w0 = prompts[i] + k0[j] - admitted[i]
            for t in range(r, h + 1):
                # gone from offset r on: W + t, or net of a refill growing in step
                want[j, workers[i], t] += w0 + t if refill < 0 else w0 + r - refill
    np.testing.assert_allclose(taken, want)


def test_decision_loss_is_the_discounted_imbalance_after_admission():
    loads = np.array([[100.0, 90.0, 80.0], [50.0, 60.0, 70.0]])
    weights = np.array([1.0, 0.5, 0.25])
    loss = decision_loss(loads, np.array([1]), np.array([30.0]), weights)
    after = loads + np.array([[0, 0, 0], [30, 31, 32]])
    want = ((2 * after.max(axis=0) - after.sum(axis=0)) * weights).sum()
    assert loss == pytest.approx(want)


def _feed(guard, better: bool, snapshots: int) -> None:
    """Snapshots on 2 workers where the estimator's decision puts the request on the worker
    that really loses load (``better``) or on the one that does not."""
    h = guard.horizon
    for s in range(snapshots):
        k = s * (h + 2)
        none = np.array([[1000.0] * (h + 1), [1000.0] * (h + 1)])
        good, bad = (np.array([0]), np.array([300.0])), (np.array([1]), np.array([300.0]))
        guard.record(
            k,
            none,
            None,
            np.ones(h + 1),
            without=bad if better else good,
            with_estimator=good if better else bad,
        )
        # a request on worker 0, admitted before the snapshot, leaves one iteration later
        guard.departed(k + 1, np.array([0]), np.array([500.0]), np.array([k - 5]))
    guard.departed((snapshots + 1) * (h + 2), np.zeros(0, np.int64), np.zeros(0), np.zeros(0))


@pytest.mark.parametrize(("better", "verdict"), [(True, 1.0), (False, 0.0)])
def test_verdict_follows_the_decisions_judged_on_what_happened(better, verdict):
    guard = ProjectionGuard(2, 4, 8, stride=1, memory=32)
    _feed(guard, better, MIN_SNAPSHOTS + 4)
    assert guard.scored == MIN_SNAPSHOTS + 4
    assert guard.weight == verdict
    change = guard.stats()["guard_decision_change"]
    assert (change < 0) == better


def test_no_verdict_before_enough_snapshots_and_bounded_state():
    guard = ProjectionGuard(2, 4, 8, stride=1, memory=32)
    size = sum(a.nbytes for a in (guard.taken, guard.none, guard.dec_workers, guard.moments))
    _feed(guard, True, MIN_SNAPSHOTS - 1)
    assert guard.weight == 0.0  # steps aside until measurably better
    _feed(guard, True, 200)
    assert (
        sum(a.nbytes for a in (guard.taken, guard.none, guard.dec_workers, guard.moments)) == size
    )
    assert guard.live.sum() <= guard.live.shape[0]


def _history():
    rng = np.random.default_rng(7)
    return frame(rng.integers(100, 3000, 400), rng.integers(1, 120, 400))


def _replay(estimator, **options):
    rng = np.random.default_rng(6)
    prompts, outputs = rng.integers(100, 3000, 600), rng.integers(1, 120, 600)
    pol = BRHPolicy(estimator=estimator, horizon=16, **options)
    return pol, simulate(released(prompts, outputs), pol, SimConfig(workers=3, slots=6))


def test_brh_guards_learned_estimators_and_reports_it():
    pol, res = _replay(SurvivalEstimator(horizon=16).fit(_history()))
    assert pol.guard is not None
    assert {"guard_weight", "guard_snapshots", "guard_share_with_estimator"} <= set(res.extras)
    assert res.extras["guard_snapshots"] >= MIN_SNAPSHOTS
    assert not pol.worker_of  # every finished request left the guard's map


def test_guard_off_references_and_paper_brh_are_unguarded():
    pol, res = _replay(SurvivalEstimator(horizon=16).fit(_history()), guard=False)
    assert pol.guard is None and "guard_weight" not in res.extras
    for est in (NoPrediction(horizon=16).fit(), None):
        assert _replay(est)[0].guard is None
    rng = np.random.default_rng(6)
    oracle = OracleEstimator(horizon=16).fit(
        frame(rng.integers(100, 3000, 600), rng.integers(1, 120, 600))
    )
    assert _replay(oracle)[0].guard is None
    assert PaperBRHPolicy().config.guard is False


def test_stepping_aside_routes_exactly_like_no_prediction(monkeypatch):
    """A guard that never finds the estimator measurably better leaves brh:none's decisions."""
    monkeypatch.setattr(guard_module, "MIN_SNAPSHOTS", 10**9)
    _, guarded = _replay(SurvivalEstimator(horizon=16).fit(_history()))
    _, none = _replay(None)
    assert guarded.extras["guard_share_with_estimator"] == 0.0
    np.testing.assert_array_equal(guarded.worker, none.worker)
    np.testing.assert_array_equal(guarded.admit_iter, none.admit_iter)


def test_snapshots_keep_the_projections_as_they_were_before_the_step(monkeypatch):
    """The step updates the loads it scores against in place; the guard's P0 must not see it."""
    recorded = []
    original = ProjectionGuard.record

    def spy(self, k, none, *args, **kwargs):
        recorded.append((k, none.copy()))
        return original(self, k, none, *args, **kwargs)

    monkeypatch.setattr(ProjectionGuard, "record", spy)
    _, res = _replay(SurvivalEstimator(horizon=16).fit(_history()))
    assert recorded
    for k, none in recorded[:30]:
        admitted = res.admit_iter == k
        before = res.loads[k] - np.bincount(
            res.worker[admitted], weights=res.prompt_tokens[admitted], minlength=3
        )
        np.testing.assert_allclose(none[:, 0], before, err_msg=f"iteration {k}")

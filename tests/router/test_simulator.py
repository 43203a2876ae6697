"""Simulator dynamics and metrics against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

import balanceroute.router.lab.simulator as simulator_module
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.metrics import summarize
from balanceroute.router.lab.simulator import RoutingViolation, SimConfig, simulate
from balanceroute.router.policies.baselines import CountJSQPolicy
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.state import Admissions
from tests.router.helpers import released

COST = CostModel(t_fixed_s=1.0, t_token_s=0.1)


def test_two_workers_three_requests_by_hand():
    # r0 (S=10, O=2) -> w0, r1 (S=4, O=1) -> w1, r2 (S=6, O=3) -> w0 (count tie -> lowest).
    # Loads after admission: k0 (16, 4), k1 (18, 0), k2 (8, 0).
    rq = released([10, 4, 6], [2, 1, 3])
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=2, slots=2, cost=COST))
    assert res.iterations == 3
    np.testing.assert_array_equal(res.loads, [[16, 4], [18, 0], [8, 0]])
    np.testing.assert_allclose(res.imbalance, [12, 18, 8])
    np.testing.assert_allclose(res.t_start, [0, 2.6, 5.4, 7.2])
    s = summarize(res)
    assert s["mean_imbalance"] == pytest.approx(38 / 3)
    assert s["throughput_tok_s"] == pytest.approx(6 / 7.2)
    # TPOT: r0 5.4/2, r1 2.6/1, r2 7.2/3 -> p50 is 2.6 s
    assert s["tpot_p50_ms"] == pytest.approx(2600)
    assert s["barrier_wait_fraction"] == pytest.approx(0.1 * 38 / (2 * 7.2))
    assert s["queue_delay_p99_s"] == 0
    assert s["steady_mean_imbalance"] is None
    assert s["completed_requests"] == 3


def test_queueing_delay_and_steady_state_by_hand():
    # One worker, one slot: r1 waits for r0 (O=2), r2 for r1 (O=1).
    rq = released([5, 3, 2], [2, 1, 1])
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=1, slots=1, cost=COST))
    # k0: r0 (5), k1: r0 (6), k2: r1 (3), k3: r2 (2)
    np.testing.assert_allclose(res.max_load, [5, 6, 3, 2])
    np.testing.assert_allclose(res.t_start, [0, 1.5, 3.1, 4.4, 5.6])
    np.testing.assert_array_equal(res.waiting, [2, 2, 1, 0])
    s = summarize(res)
    np.testing.assert_allclose(sorted(res.admit_s - res.release_s), [0, 3.1, 4.4])
    assert s["max_queue_delay_s"] == pytest.approx(4.4)
    assert s["steady_iterations"] == 3
    assert s["steady_mean_imbalance"] == 0  # one worker is always balanced


def test_idle_gaps_are_skipped_not_iterated():
    rq = released(
        [10, 10], [2, 2], arrivals=[0.0, 100.0], saturate=False, t_fixed_s=0.0, t_token_s=0.0
    )
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=1, slots=4, cost=COST))
    assert res.iterations == 4
    assert res.admit_s[1] == pytest.approx(100.0)
    assert summarize(res)["queue_delay_p99_s"] == pytest.approx(0.0)


def test_span_skipping_matches_iteration_by_iteration(monkeypatch):
    rng = np.random.default_rng(3)
    prompts = rng.integers(1, 400, 300)
    outputs = rng.integers(1, 300, 300)
    arrivals = np.sort(rng.uniform(0, 60, 300))
    rq = released(prompts, outputs, arrivals=arrivals, saturate=False)
    cfg = SimConfig(workers=4, slots=8)
    fast = simulate(rq, CountJSQPolicy(), cfg)
    monkeypatch.setattr(simulator_module, "SPAN_LIMIT", 1)
    slow = simulate(rq, CountJSQPolicy(), cfg)
    np.testing.assert_array_equal(fast.loads, slow.loads)
    np.testing.assert_allclose(fast.t_start, slow.t_start)
    np.testing.assert_array_equal(fast.waiting, slow.waiting)
    np.testing.assert_array_equal(fast.admit_iter, slow.admit_iter)


class _Greedy(Policy):
    """Deliberately broken policies for the validator."""

    name = "broken"

    def __init__(self, mode: str) -> None:
        self.mode = mode

    def route(self, state):
        head = state.pool.head(state.pool.size)
        due = state.admissions_due
        if self.mode == "overfill":
            return Admissions(head[:due], np.zeros(due, dtype=np.int64))
        if self.mode == "duplicate":
            return Admissions(np.repeat(head[:1], due), np.arange(due) % state.workers)
        if self.mode == "lazy":
            return Admissions(head[:1], np.zeros(1, dtype=np.int64))
        raise AssertionError


@pytest.mark.parametrize(
    ("mode", "message"),
    [("overfill", "free slots"), ("duplicate", "twice"), ("lazy", "were due")],
)
def test_violations_name_policy_and_iteration(mode, message):
    rq = released([5] * 6, [3] * 6)
    with pytest.raises(RoutingViolation, match=rf"policy 'broken' at iteration 0: .*{message}"):
        simulate(rq, _Greedy(mode), SimConfig(workers=2, slots=2))


def test_same_seed_same_result_bit_for_bit():
    rng = np.random.default_rng(0)
    rq = released(rng.integers(1, 500, 400), rng.integers(1, 200, 400))
    from balanceroute.router.policies.baselines import RandomPolicy

    a = simulate(rq, RandomPolicy(), SimConfig(workers=4, slots=8, seed=7))
    b = simulate(rq, RandomPolicy(), SimConfig(workers=4, slots=8, seed=7))
    c = simulate(rq, RandomPolicy(), SimConfig(workers=4, slots=8, seed=8))
    np.testing.assert_array_equal(a.loads, b.loads)
    np.testing.assert_array_equal(a.worker, b.worker)
    assert not np.array_equal(a.worker, c.worker)

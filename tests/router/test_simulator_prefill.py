"""The simulator's colocated prefill term against hand-computed cases."""

from __future__ import annotations

import numpy as np
import pytest

import balanceroute.router.lab.simulator as simulator_module
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.metrics import summarize
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.baselines import CountJSQPolicy
from tests.router.helpers import released

PREFILL = CostModel(t_fixed_s=1.0, t_token_s=0.01, t_prefill_s=0.1, prefill_chunk_tokens=4)


def test_prefill_chunks_stall_the_group_and_delay_the_first_token_by_hand():
    # r0 (S=10, O=2) -> w0, r1 (S=4, O=1) -> w1. Chunks of 4: w0 computes 4, 4, 2 tokens in
    # k0..k2 (first token at the end of k2), w1 its 4 in k0 (its only token, done at k1).
    # k0: loads (10, 4), P (4, 4): 1 + max(0.1 + 0.4, 0.04 + 0.4) = 1.5
    # k1: loads (10, 0), P (4, 0): 1 + 0.1 + 0.4 = 1.5
    # k2: loads (10, 0), P (2, 0): 1 + 0.1 + 0.2 = 1.3
    # k3: loads (11, 0), no prefill: 1 + 0.11 = 1.11; r0 leaves at k4.
    rq = released([10, 4], [2, 1])
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=2, slots=2, cost=PREFILL))
    np.testing.assert_array_equal(res.loads, [[10, 4], [10, 0], [10, 0], [11, 0]])
    np.testing.assert_allclose(res.t_start, [0, 1.5, 3.0, 4.3, 5.41])
    np.testing.assert_array_equal(res.prefill_steps, [2, 0])
    np.testing.assert_allclose(res.finish_s, [5.41, 1.5])
    assert summarize(res)["throughput_tok_s"] == pytest.approx(3 / 5.41)


def test_without_the_prefill_term_the_same_requests_decode_at_once():
    rq = released([10, 4], [2, 1])
    decode_only = CostModel(t_fixed_s=1.0, t_token_s=0.01, prefill_chunk_tokens=4)
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=2, slots=2, cost=decode_only))
    np.testing.assert_allclose(res.t_start, [0, 1.1, 2.21])
    assert res.prefill_steps is None
    np.testing.assert_allclose(res.finish_s, [2.21, 1.1])


def test_prompts_on_one_worker_share_its_chunk_first_come_first_served():
    # One worker, chunk 4: r0 (S=6) then r1 (S=3) -> 4, 4, 1 tokens in k0..k2; r0's last
    # token is computed in k1, r1's in k2. Outputs of 1: r0 leaves at k2, r1 at k3.
    rq = released([6, 3], [1, 1])
    res = simulate(rq, CountJSQPolicy(), SimConfig(workers=1, slots=2, cost=PREFILL))
    np.testing.assert_array_equal(res.prefill_steps, [1, 2])
    # k0: 1 + 0.09 + 0.4; k1: 1 + 0.09 + 0.4; k2: r0 gone, 1 + 0.03 + 0.1
    np.testing.assert_allclose(res.t_start, [0, 1.49, 2.98, 4.11])
    np.testing.assert_array_equal(res.admit_iter + res.prefill_steps + 1, [2, 3])


def test_a_zero_prefill_cost_changes_nothing():
    rng = np.random.default_rng(5)
    rq = released(rng.integers(1, 5000, 200), rng.integers(1, 200, 200))
    base = simulate(rq, CountJSQPolicy(), SimConfig(workers=4, slots=8))
    tiny_chunks = CostModel(prefill_chunk_tokens=1)  # t_prefill 0: the chunk is not used
    same = simulate(rq, CountJSQPolicy(), SimConfig(workers=4, slots=8, cost=tiny_chunks))
    np.testing.assert_array_equal(base.t_start, same.t_start)
    np.testing.assert_array_equal(base.loads, same.loads)
    a, b = summarize(base), summarize(same)
    for key in ("mean_imbalance", "throughput_tok_s", "tpot_p95_ms", "steady_throughput_tok_s"):
        assert a[key] == b[key]


def test_prefill_with_spans_matches_iteration_by_iteration(monkeypatch):
    rng = np.random.default_rng(7)
    prompts = rng.integers(1, 3000, 300)
    outputs = rng.integers(1, 300, 300)
    arrivals = np.sort(rng.uniform(0, 60, 300))
    rq = released(prompts, outputs, arrivals=arrivals, saturate=False)
    cost = CostModel(t_prefill_s=20e-6, prefill_chunk_tokens=512)
    cfg = SimConfig(workers=4, slots=8, cost=cost)
    fast = simulate(rq, CountJSQPolicy(), cfg)
    monkeypatch.setattr(simulator_module, "SPAN_LIMIT", 1)
    slow = simulate(rq, CountJSQPolicy(), cfg)
    np.testing.assert_array_equal(fast.loads, slow.loads)
    np.testing.assert_allclose(fast.t_start, slow.t_start)
    np.testing.assert_array_equal(fast.admit_iter, slow.admit_iter)
    np.testing.assert_array_equal(fast.prefill_steps, slow.prefill_steps)
    base = simulate(rq, CountJSQPolicy(), SimConfig(workers=4, slots=8))
    assert fast.t_start[-1] > base.t_start[-1]  # prefill makes the run longer
    assert (fast.prefill_steps > 0).any()

"""Property-based invariants, checked from the recorded outcome for every registered policy:
never over capacity, every request admitted exactly once (after its release) and finished,
maximal admission, and determinism for a fixed seed."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.predict.oracle import OracleEstimator
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.registry import policy_class, policy_names
from tests.router.helpers import frame, occupancy, released

BR_VARIANTS = [
    ("br0", {}),
    ("br0", {"s_greedy": 0, "window": 3, "max_overtake": 2}),
    ("brh", {"horizon": 6, "gamma": 0.9, "beta": 4.0}),
    ("brh", {"horizon": 6, "projection": "expected", "refill": True, "refresh": 3}),
    ("brh", {"horizon": 4, "penalty": "max", "s_greedy": 0, "max_wait_iters": 3}),
]
BASELINES = [n for n in policy_names() if n not in ("br0", "brh")]
CASES = [(n, {}, False) for n in BASELINES] + [(n, o, False) for n, o in BR_VARIANTS]
CASES += [("brh", {"horizon": 6}, True), ("brh", {"horizon": 5, "projection": "expected"}, True)]


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 50))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    saturate = draw(st.booleans())
    gaps = draw(st.lists(st.floats(0, 3), min_size=n, max_size=n))
    arrivals = np.cumsum(gaps)
    workers = draw(st.integers(1, 5))
    slots = draw(st.integers(1, 4))
    seed = draw(st.integers(0, 2**16))
    return prompts, outputs, arrivals, saturate, workers, slots, seed


def make(name, opts, oracle, fr):
    cls = policy_class(name)
    if name in ("br0", "brh"):
        est = (
            OracleEstimator(horizon=opts.get("horizon", DEFAULT_HORIZON)).fit(fr)
            if oracle
            else None
        )
        return cls(estimator=est, **opts)
    return cls()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=workloads(), case=st.sampled_from(CASES))
def test_policy_invariants(data, case):
    prompts, outputs, arrivals, saturate, g, b, seed = data
    name, opts, oracle = case
    fr = frame(prompts, outputs, arrivals)
    rq = released(prompts, outputs, arrivals=arrivals, saturate=saturate)
    cfg = SimConfig(workers=g, slots=b, seed=seed)
    res = simulate(rq, make(name, opts, oracle, fr), cfg)
    n = len(prompts)
    # every request admitted exactly once, after its release, and finished
    assert (res.admit_iter >= 0).all()
    assert np.all(res.admit_s >= res.release_s - 1e-9)
    assert np.all(res.finish_s <= res.t_start[-1] + 1e-9)
    assert np.array_equal(np.sort(res.trace_index), np.arange(n))
    occ = occupancy(res)
    # never over capacity
    assert occ.max() <= b
    # maximal: whenever requests were left waiting after admission, every slot was full
    waiting = res.waiting > 0
    assert np.all(occ[waiting].sum(axis=1) == g * b)
    # loads recorded equal the sum of the running requests' workloads
    assert res.loads.sum() == _workload_total(res)
    # determinism (not for `exact`: its MIP stops at a wall-clock limit, so on a loaded machine
    # a second run may stop at another incumbent; it failed CI-like runs so under load)
    if name == "exact":
        return
    again = simulate(rq, make(name, opts, oracle, fr), cfg)
    np.testing.assert_array_equal(res.worker, again.worker)
    np.testing.assert_array_equal(res.admit_iter, again.admit_iter)


def _workload_total(res) -> float:
    """Sum over iterations and requests of S_i + (k - x_i) while active."""
    o = res.output_tokens.astype(np.int64)
    return float(np.sum(res.prompt_tokens * o + o * (o - 1) // 2))

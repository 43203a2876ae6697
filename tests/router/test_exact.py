"""The MILP against brute force on tiny instances, and the exact policy's invariants."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.exact import ExactPolicy, solve_step, step_objective
from tests.router.helpers import occupancy, released


def brute_force(loads, free, prompts, gamma, capacity=None):
    n = len(prompts)
    for due in range(min(n, sum(free)), -1, -1):
        best = _best_of(loads, free, prompts, gamma, capacity, due)
        if best < np.inf:
            return best
    return np.inf


def _best_of(loads, free, prompts, gamma, capacity, due):
    g_count, n = len(free), len(prompts)
    best = np.inf
    for chosen in itertools.combinations(range(n), due):
        for workers in itertools.product(range(g_count), repeat=due):
            if any(workers.count(g) > free[g] for g in range(g_count)):
                continue
            if capacity is not None:
                after = loads.copy()
                hs = np.arange(loads.shape[1])
                for j, g in zip(chosen, workers, strict=True):
                    after[g] += prompts[j] + hs
                if (after > capacity + 1e-9).any():
                    continue
            best = min(best, step_objective(loads, prompts, chosen, workers, gamma))
    return best


@settings(max_examples=40, deadline=None)
@given(
    g=st.integers(1, 3),
    h=st.integers(0, 3),
    n=st.integers(1, 4),
    data=st.data(),
    gamma=st.floats(0.5, 1.0),
)
def test_milp_matches_brute_force(g, h, n, data, gamma):
    loads = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 3000), min_size=h + 1, max_size=h + 1),
                min_size=g,
                max_size=g,
            )
        ),
        dtype=float,
    )
    free = data.draw(st.lists(st.integers(0, 2), min_size=g, max_size=g))
    prompts = np.array(data.draw(st.lists(st.integers(1, 2000), min_size=n, max_size=n)), float)
    sol = solve_step(loads, np.array(free), prompts, gamma=gamma)
    assert len(sol.requests) == min(n, sum(free))
    assert sol.objective == pytest.approx(
        brute_force(loads, free, prompts, gamma), rel=1e-7, abs=1e-5
    )


def test_milp_respects_kv_capacity_like_brute_force():
    loads = np.array([[900.0, 901.0], [0.0, 1.0]])
    prompts = np.array([300.0, 50.0, 80.0])
    sol = solve_step(loads, np.array([2, 1]), prompts, kv_capacity=1000.0)
    assert sol.objective == pytest.approx(brute_force(loads, [2, 1], prompts, 1.0, capacity=1000.0))


def test_exact_policy_is_maximal_and_within_capacity():
    rng = np.random.default_rng(1)
    rq = released(rng.integers(1, 2000, 60), rng.integers(1, 20, 60))
    res = simulate(rq, ExactPolicy(candidates=8), SimConfig(workers=3, slots=2))
    occ = occupancy(res)
    assert occ.max() <= 2
    assert np.all(occ[res.waiting > 0].sum(axis=1) == 6)


def test_single_admission_fast_path_matches_the_milp():
    rng = np.random.default_rng(4)
    from balanceroute.router.policies.exact import best_single

    for _ in range(30):
        loads = rng.integers(0, 5000, 4).astype(float)
        free = rng.integers(0, 2, 4)
        free[rng.integers(4)] = 1
        prompts = rng.integers(1, 3000, 6).astype(float)
        j, g = best_single(loads, free, prompts)
        fast = step_objective(loads[:, None], prompts, [j], [g])
        exact = min(
            step_objective(loads[:, None], prompts, [jj], [gg])
            for jj in range(6)
            for gg in range(4)
            if free[gg] > 0
        )
        assert fast == pytest.approx(exact)


def test_solve_step_command_reports_heuristic_and_exact(tmp_path, capsys):
    import json

    from balanceroute.cli import main as balanceroute_main

    state = {
        "policy": "br0",
        "workers": [
            {"free_slots": 1, "running": [{"id": "a", "prompt_tokens": 900, "age": 10}]},
            {"free_slots": 0, "running": [{"id": "b", "prompt_tokens": 1500, "age": 3}]},
            {"free_slots": 2, "running": []},
        ],
        "pool": [{"id": f"p{i}", "prompt_tokens": s} for i, s in enumerate([5000, 800, 1300, 60])],
    }
    path = tmp_path / "state.json"
    path.write_text(json.dumps(state))
    assert balanceroute_main(["solve-step", "--state", str(path)]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["exact"]["proven_optimal"]
    assert out["heuristic"]["objective"] >= out["exact"]["objective"] - 1e-9
    assert len(out["exact"]["admissions"]) == 3
    path.write_text('{"policy": "br0", "workers": [], "pool": []}')
    assert balanceroute_main(["solve-step", "--state", str(path)]) == 2

"""BalanceRoute scores by hand, and the subset search against brute force."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.router.policies.scoring import br0_score, discount_weights, horizon_score
from tests.router.reference_br import best_subset


def test_br0_score_below_margin_overflow_and_edge():
    # below the margin: rewarded one for one
    assert br0_score(np.array([100.0]), 150.0, 8)[0] == 100.0
    # exactly at the margin: no penalty
    assert br0_score(np.array([150.0]), 150.0, 8)[0] == 150.0
    # overflow by 50 costs G per token: 200 - 8 * 50
    assert br0_score(np.array([200.0]), 150.0, 8)[0] == -200.0
    # the max worker (margin 0): every token overflows, net -(G - 1) per token
    assert br0_score(np.array([10.0]), 0.0, 4)[0] == -30.0


def test_horizon_score_by_hand():
    w = discount_weights(2, 0.5)
    np.testing.assert_allclose(w, [1.0, 0.5, 0.25])
    margins = np.array([100.0, 50.0, 200.0])
    # overflow only at h = 1 by 30 (weight 0.5): 1.75 * 80 - 4 * 15
    assert horizon_score(np.array([80.0]), margins, w, 4.0)[0] == pytest.approx(80.0)
    # the max-penalty variant charges Gamma times the largest overflow: 140 - 4 * 52.5
    assert horizon_score(np.array([80.0]), margins, w, 4.0, "max")[0] == pytest.approx(-70.0)


def test_horizon_zero_with_beta_g_is_br0():
    b = np.array([10.0, 150.0, 400.0])
    w = discount_weights(0, 0.64)
    np.testing.assert_allclose(horizon_score(b, np.array([150.0]), w, 8.0), br0_score(b, 150.0, 8))


@settings(max_examples=150, deadline=None)
@given(
    prompts=st.lists(st.integers(1, 5000), min_size=1, max_size=6),
    margins=st.lists(st.floats(-500, 8000), min_size=1, max_size=5),
    gamma=st.floats(0.3, 1.0),
    beta=st.floats(0.5, 60),
    max_size=st.integers(1, 6),
    penalty=st.sampled_from(["sum", "max"]),
)
def test_best_subset_matches_brute_force(prompts, margins, gamma, beta, max_size, penalty):
    p = np.array(prompts, dtype=float)
    m = np.array(margins)
    w = discount_weights(len(margins) - 1, gamma)
    chosen, score, _, _ = best_subset(
        p.tolist(), m.tolist(), w.tolist(), beta, max_size, penalty == "max"
    )
    chosen = np.array(chosen)
    best = -np.inf
    for size in range(1, min(max_size, len(prompts)) + 1):
        for combo in itertools.combinations(range(len(prompts)), size):
            s = horizon_score(np.array([p[list(combo)].sum()]), m, w, beta, penalty)[0]
            best = max(best, s)
    assert score == pytest.approx(best, rel=1e-9, abs=1e-6)
    assert 1 <= chosen.size <= max_size
    assert horizon_score(np.array([p[chosen].sum()]), m, w, beta, penalty)[0] == pytest.approx(
        score, rel=1e-9, abs=1e-6
    )

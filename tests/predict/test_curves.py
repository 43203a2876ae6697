"""The compiled curve and path kernels of ``predict`` against their numpy definitions."""

from __future__ import annotations

import numpy as np

from balanceroute.features.windows import MarginalCounts
from balanceroute.predict.curves import hazard_curves, shaped_curves, within_horizon_curves
from balanceroute.predict.projection import request_paths


def test_shaped_curves_kernel_equals_its_definition():
    """``1 - p * clip01((S(a) - S(a+h)) / mass)`` where there is mass, ``1 - p * h / H`` else."""
    rng = np.random.default_rng(0)
    marginal = MarginalCounts()
    marginal.add(rng.integers(1, 120, 500), 1)
    h = 20
    ages = rng.integers(0, 160, 300)
    p = rng.random(300)
    s_a, s_b = marginal.surv(ages), marginal.surv(ages + h)
    mass = s_a - s_b
    ok = mass > 0
    safe = np.where(ok, mass, 1.0)
    got = shaped_curves(marginal.curves()[0], ages, h, np.zeros((0, 0)), 1.0, s_a, safe, ok, p)
    want = np.ones((ages.size, h + 1))
    for j in range(1, h + 1):
        f = np.where(ok, np.clip((s_a - marginal.surv(ages + j)) / safe, 0.0, 1.0), j / h)
        want[:, j] = 1.0 - p * f
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)


def test_geometric_curves_are_survival_curves_with_the_asked_mass():
    rng = np.random.default_rng(1)
    p = rng.random(50)
    curves = within_horizon_curves(p, rng.uniform(1, 30, 50), 30)
    assert (np.diff(curves, axis=1) <= 1e-12).all() and (curves[:, 0] == 1.0).all()
    np.testing.assert_allclose(1.0 - curves[:, -1], p, atol=1e-12)


def test_request_paths_kernel_equals_its_definition():
    """``S(t) (W + t)`` plus, with a refill prompt ``s``, ``(1 - S(t)) s + sum_{u<t} (1 - S(u))``."""
    rng = np.random.default_rng(2)
    surv = np.sort(rng.random((40, 31)), axis=1)[:, ::-1]
    surv[:, 0] = 1.0
    w = rng.integers(10, 5000, 40).astype(float)
    t = np.arange(31)
    np.testing.assert_allclose(request_paths(w, surv), surv * (w[:, None] + t), rtol=1e-12)
    gone = 1.0 - surv
    before = np.cumsum(gone, axis=1) - gone
    want = surv * (w[:, None] + t) + 700.0 * gone + before
    np.testing.assert_allclose(request_paths(w, surv, 700.0), want, rtol=1e-12)


def test_hazard_curves_kernel_equals_its_definition():
    """``S(h) = S(e_{j-1}) (1 - q_j) ** ((h - e_{j-1}) / w_j)`` in bin ``j``, so each bin's end
    keeps ``1 - q_j`` of those alive at its start."""
    rng = np.random.default_rng(3)
    ends = np.array([1, 2, 3, 5, 8, 13, 20])
    hz = rng.random((60, ends.size))
    hz[0] = 0.0
    hz[1, 2] = 1.0
    got = hazard_curves(hz, ends)
    want = np.ones((60, ends[-1] + 1))
    lo, s = 0, np.ones(60)
    for j, hi in enumerate(ends):
        h = np.arange(lo + 1, hi + 1)
        want[:, lo + 1 : hi + 1] = s[:, None] * (1 - hz[:, [j]]) ** ((h - lo) / (hi - lo))
        s, lo = want[:, hi], hi
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got[:, ends[2]] / got[:, ends[1]], 1 - hz[:, 2], rtol=1e-12)
    assert (got[0] == 1).all() and (got[1, 3:] == 0).all()

"""The compiled curve and path kernels of ``predict`` against their numpy definitions."""

from __future__ import annotations

import numpy as np

from balanceroute.features.windows import MarginalCounts
from balanceroute.predict.curves import shaped_curves, within_horizon_curves
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

"""Survival curves over the horizon for a classifier's finishing probability ``p``.

A classifier answers ``p = P(r <= H)``; BR-H's expected projection needs the whole curve
``P(r > h)``, ``h = 0..H``. Two shapes spread ``p`` over ``1..H``:

- :func:`within_horizon_curves`: a truncated geometric whose mean matches a regressor's
  ``E[r | r <= H]`` (the best point estimate of ``c``);
- :func:`shaped_curves`: like the window's own outputs above the request's age (the marginal's
  survival counts, or a key's blended with them), so the near-term departures BR-H scores are
  placed where the recent traffic says they fall.

A discrete-time hazard model answers each bin's chance to finish instead; :func:`hazard_curves`
turns those into curves (a constant per-iteration hazard within each bin).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.features.blend import clip01, mixed_count

_THETA = np.linspace(-8.0, 8.0, 2001)


def _geometric_means(horizon: int) -> np.ndarray:
    """Mean of the truncated geometric on 1..H with log-ratio theta, for every grid theta."""
    j = np.arange(1, horizon + 1, dtype=np.float64)
    logw = _THETA[:, None] * (j - 1)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    return (w * j).sum(axis=1) / w.sum(axis=1)


def within_horizon_curves(p: np.ndarray, mean: np.ndarray, horizon: int) -> np.ndarray:
    """Survival curves ``(n, H+1)``: ``1 - p * G(h)``, G a truncated geometric with this mean."""
    h = int(horizon)
    n = p.shape[0]
    if h == 0:
        return np.ones((n, 1))
    mu = _geometric_means(h)
    theta = np.interp(np.clip(mean, mu[0], mu[-1]), mu, _THETA)
    logw = theta[:, None] * np.arange(h)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    g = np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True)  # G(1..H)
    curves = np.ones((n, h + 1))
    curves[:, 1:] = 1.0 - p[:, None] * g
    return curves


@njit(cache=True, nogil=True)
def shaped_curves(surv, ages, horizon, key_surv, bw, s_a, mass, ok, p):
    """``1 - p * F(h)`` with ``F(h) = (S(a) - S(a+h)) / mass`` from the marginal's counts (plus
    the key's, ``key_surv + bw * S_m``, when given), ``h / H`` where there is no mass."""
    n = ages.shape[0]
    out = np.ones((n, horizon + 1))
    for i in range(n):
        for h in range(1, horizon + 1):
            if ok[i]:
                s = mixed_count(surv, key_surv, i, ages[i] + h, h, bw, 1.0)
                f = (s_a[i] - s) / mass[i]
            else:
                f = h / horizon
            out[i, h] = 1.0 - p[i] * clip01(f)
    return out


@njit(cache=True, nogil=True)
def hazard_curves(hazard, ends):
    """Survival curves ``(n, H+1)``, ``H = ends[-1]``, from per-bin hazards ``(n, bins)``: bin
    ``j`` covers ``ends[j-1] < h <= ends[j]`` (``ends[-1] = 0``) and ends a request alive at its
    start with probability ``hazard[:, j]``, spread as a constant per-iteration hazard, so
    ``P(r > h) = P(r > ends[j-1]) * (1 - hazard[:, j]) ** ((h - ends[j-1]) / width_j)``."""
    n, bins = hazard.shape
    out = np.ones((n, ends[bins - 1] + 1))
    for i in range(n):
        s = 1.0
        lo = 0
        for j in range(bins):
            hi = ends[j]
            keep = (1.0 - min(max(hazard[i, j], 0.0), 1.0)) ** (1.0 / (hi - lo))
            step = s
            for h in range(lo + 1, hi + 1):
                step *= keep
                out[i, h] = step
            s = out[i, hi]
            lo = hi
    return out

"""Survival curves of running requests kept between predictions, advanced by age
(docs/design.md, "Incremental prediction").

A curve predicted at age ``a``, ``S_a(h) = P(r > h)`` for ``h = 0..H``, answers at age ``a + d``
by conditioning on survival: ``S_{a+d}(h) = S_a(d + h) / S_a(d)``, with ``S_a`` held at its last
value beyond ``H`` (nothing is known there). For an estimator whose curve is the ratio of one
survival function, ``S(a + h) / S(a)`` (``survival``, ``exactmatch``'s shrink blend, the oracle,
``none``), that is the answer it would give itself, up to what it learned in between; where
``S_a(d) = 0`` the request has outlived its curve and is projected to survive, as the
estimators answer a request older than all their evidence. ``gbdt``'s and ``hazard``'s
answers move with their age and time features (and ``hazard``'s bins with the present): their
requests are predicted afresh every ``repredict`` iterations.

:class:`CurveCache` holds one row per running request (bounded by the running requests; a
row is freed when its request finishes) and :func:`conditioned_loads` turns the rows into
per-worker projected loads in one compiled pass, with the refill rule of
:func:`balanceroute.predict.projection.request_paths`.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True)
def conditioned_loads(rows, ages, workers, workloads, curves, pred_age, known, refill, g_count):
    """Projected loads ``(G, H+1)`` of running requests from cached curves conditioned on
    their current age; rows without a curve (``known`` false) survive every offset.

    Request ``i`` contributes ``S(h) (W + h)``, plus with ``refill >= 0`` the refilled slot:
    ``refill (1 - S(h)) + sum_{u<h} (1 - S(u))``; ``S(0) = 1`` (it is alive now). Summed per
    worker as ``sum S W`` and ``sum S`` (one multiply-add per request and offset), then
    combined over the offsets.
    """
    h1 = curves.shape[1]
    last = h1 - 1
    sw = np.zeros((g_count, h1))  # sum_i S_i(h) W_i
    ss = np.zeros((g_count, h1))  # sum_i S_i(h)
    count = np.zeros(g_count)
    for i in range(rows.shape[0]):
        r = rows[i]
        g = workers[i]
        w = workloads[i]
        count[g] += 1.0
        sw[g, 0] += w
        ss[g, 0] += 1.0
        d = ages[i] - pred_age[r]
        d = 0 if d < 0 else (last if d > last else d)
        s_d = curves[r, d] if known[r] else 0.0
        if s_d <= 0.0:  # no curve, or outlived it: survives every offset
            for h in range(1, h1):
                sw[g, h] += w
                ss[g, h] += 1.0
            continue
        inv = 1.0 / s_d
        for h in range(1, last - d + 1):
            s = curves[r, d + h] * inv
            s = 1.0 if s > 1.0 else (0.0 if s < 0.0 else s)
            sw[g, h] += s * w
            ss[g, h] += s
        s = curves[r, last] * inv
        s = 1.0 if s > 1.0 else (0.0 if s < 0.0 else s)
        for h in range(max(last - d + 1, 1), h1):
            sw[g, h] += s * w
            ss[g, h] += s
    out = np.empty((g_count, h1))
    for g in range(g_count):
        acc = 0.0  # sum_{u<h} (count - ss[u]): the refills' growth so far
        for h in range(h1):
            v = sw[g, h] + h * ss[g, h]
            if refill >= 0.0:
                gone = count[g] - ss[g, h]
                v += refill * gone + acc
                acc += gone
            out[g, h] = v
    return out


class CurveCache:
    """One cached survival curve per running request, by its position in the run's table."""

    def __init__(self, horizon: int, n_requests: int) -> None:
        self.horizon = horizon
        self.row_of = np.full(n_requests, -1, dtype=np.int64)
        self.curves = np.ones((0, horizon + 1))
        self.pred_age = np.zeros(0, dtype=np.int64)
        self.pred_k = np.zeros(0, dtype=np.int64)
        self.known = np.zeros(0, dtype=np.bool_)
        self.free: list[int] = []

    @property
    def rows_in_use(self) -> int:
        return int(self.known.shape[0] - len(self.free))

    def rows(self, positions: np.ndarray) -> np.ndarray:
        """The rows of ``positions``, allocating (unknown) rows for those not seen yet."""
        rows = self.row_of[positions]
        new = np.flatnonzero(rows < 0)
        if new.size:
            grow = new.size - len(self.free)
            if grow > 0:
                cap = self.known.shape[0]
                self._grow(max(grow, cap))
            got = np.array([self.free.pop() for _ in range(new.size)], dtype=np.int64)
            self.known[got] = False
            self.row_of[positions[new]] = got
            rows[new] = got
        return rows

    def _grow(self, extra: int) -> None:
        cap = self.known.shape[0]
        h1 = self.horizon + 1
        self.curves = np.concatenate((self.curves, np.ones((extra, h1))))
        self.pred_age = np.concatenate((self.pred_age, np.zeros(extra, dtype=np.int64)))
        self.pred_k = np.concatenate((self.pred_k, np.zeros(extra, dtype=np.int64)))
        self.known = np.concatenate((self.known, np.zeros(extra, dtype=np.bool_)))
        self.free.extend(range(cap + extra - 1, cap - 1, -1))

    def stale(self, rows: np.ndarray, k: int, repredict: int) -> np.ndarray:
        """Which of ``rows`` need a prediction: none yet, or one ``repredict`` iterations old."""
        return ~self.known[rows] | (k - self.pred_k[rows] >= repredict)

    def store(self, rows: np.ndarray, curves: np.ndarray, ages: np.ndarray, k: int) -> None:
        """Curves ``(n, H+1)`` predicted at iteration ``k`` for requests of these ages."""
        self.curves[rows] = curves[:, : self.horizon + 1]
        self.pred_age[rows] = ages
        self.pred_k[rows] = k
        self.known[rows] = True

    def release(self, positions: np.ndarray) -> None:
        """Requests that finished: their rows are freed."""
        rows = self.row_of[positions]
        hit = rows >= 0
        if hit.any():
            self.row_of[positions[hit]] = -1
            self.known[rows[hit]] = False
            self.free.extend(rows[hit].tolist())

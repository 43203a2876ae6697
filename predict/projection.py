"""Projected KV loads per worker over the next ``H`` iterations (docs/design.md, "Load projection").

A running request with workload ``W`` and survival curve ``S(h) = P(r > h)`` contributes
``S(h) * (W + h)`` at offset ``h``. *Cutoff* mode (the paper's) uses ``S(h) = 1{h < c}`` from the
capped expectation ``c`` (a request predicted to outlive the window, ``c >= H``, stays for good);
*expected* mode uses the estimator's survival curve. The *refill-aware* variant adds, for each
projected departure, a new request of a typical prompt size taking the freed slot.

:class:`LoadProjection` keeps these paths between prediction refreshes: built once from the
running requests, then adjusted as requests finish (their path is removed) or are admitted
(they count as ``W + h`` for every ``h``, since nothing has been predicted for them yet).
"""

from __future__ import annotations

import numpy as np
from numba import njit


def cutoff_survival(c: np.ndarray, horizon: int, length: int) -> np.ndarray:
    """``1{h < c}`` for ``h < length``; requests with ``c >= horizon`` survive every offset."""
    hs = np.arange(length)
    alive = hs[None, :] < c[:, None]
    alive[c >= horizon, :] = True
    alive[:, 0] = True
    return alive.astype(np.float64)


def extend_survival(survival: np.ndarray, length: int) -> np.ndarray:
    """Pad survival curves ``(n, H+1)`` to ``length`` columns with their last value."""
    n, h1 = survival.shape
    if length <= h1:
        return survival[:, :length]
    out = np.empty((n, length))
    out[:, :h1] = survival
    out[:, h1:] = survival[:, -1:]
    return out


def request_paths(
    workload: np.ndarray, survival: np.ndarray, refill_prompt: float | None = None
) -> np.ndarray:
    """Expected KV contribution of each request at offsets ``h = 0..T-1`` (shape ``(n, T)``).

    With ``refill_prompt``, the slot a request frees at offset ``d`` is refilled at once by a
    request of that prompt size, adding ``(1 - S(h)) * s + sum_{u<h} (1 - S(u))``.
    """
    s = np.ascontiguousarray(survival, dtype=np.float64)
    w = np.ascontiguousarray(workload, dtype=np.float64)
    return _paths(w, s, -1.0 if refill_prompt is None else float(refill_prompt))


@njit(cache=True, nogil=True)
def _paths(workload, survival, refill):
    """:func:`request_paths` in one pass (refill < 0: none), without (n, T) temporaries."""
    n, t_len = survival.shape
    out = np.empty((n, t_len))
    for i in range(n):
        w = workload[i]
        acc = 0.0  # sum of (1 - S(u)) for u <= t, accumulated in order like np.cumsum
        for t in range(t_len):
            s = survival[i, t]
            p = s * (w + t)
            if refill >= 0.0:
                gone = 1.0 - s
                acc += gone
                p += refill * gone + (acc - gone)
            out[i, t] = p
    return out


class LoadProjection:
    """Per-worker projected loads, in columns relative to the last rebuild at iteration ``k0``.

    Requests are tracked by their position in the run's request table (``n_requests`` of them).
    Two ways to rebuild: from explicit paths (any survival curves), or, much faster, from cutoff
    lengths, where a request's path is ``W + t`` for ``t < d`` (and the refill after ``d``).
    """

    def __init__(self, workers: int, horizon: int, span: int, n_requests: int) -> None:
        self.workers = workers
        self.horizon = horizon
        self.length = horizon + span + 1
        self.k0: int | None = None
        self.hs = np.arange(horizon + 1, dtype=np.float64)
        self.ts = np.arange(self.length, dtype=np.float64)
        self.row_of = np.full(n_requests, -1, dtype=np.int64)
        self.extra_worker = np.full(n_requests, -1, dtype=np.int64)
        self.extra_const = np.zeros(n_requests)
        self.added: list[int] = []  # positions admitted since the last rebuild
        self.positions = np.zeros(0, dtype=np.int64)

    def _start(self, k: int, positions: np.ndarray, workers: np.ndarray) -> None:
        self.k0 = k
        self.row_of[self.positions] = -1
        self.row_of[positions] = np.arange(positions.shape[0])
        self.positions = positions
        self.workers_of = workers
        if self.added:
            self.extra_worker[self.added] = -1
            self.added = []
        self.count = np.zeros(self.workers)
        self.const = np.zeros(self.workers)

    def rebuild_paths(
        self, k: int, positions: np.ndarray, workers: np.ndarray, paths: np.ndarray
    ) -> None:
        """Start over at iteration ``k`` from explicit per-request paths ``(n, length)``."""
        self._start(k, positions, workers)
        onehot = np.zeros((self.workers, positions.shape[0]))
        onehot[workers, np.arange(positions.shape[0])] = 1.0
        self.base = onehot @ paths
        self.paths = paths
        self.cut = None

    def rebuild_cutoff(
        self,
        k: int,
        positions: np.ndarray,
        workers: np.ndarray,
        workload: np.ndarray,
        c: np.ndarray,
        refill_prompt: float | None = None,
    ) -> None:
        """Start over at ``k`` from capped expectations ``c``: request ``i`` is ``W_i + t`` for
        ``t < ceil(c_i)`` (for good if ``c_i >= H``), then gone, or with ``refill_prompt``
        replaced by a request of that prompt admitted then."""
        self._start(k, positions, workers)
        w = workload.astype(np.float64)
        refill = -1.0 if refill_prompt is None else float(refill_prompt)
        self.base, lengths = cutoff_base(
            workers,
            w,
            np.asarray(c, dtype=np.float64),
            float(self.horizon),
            self.workers,
            self.length,
            refill,
        )
        self.paths = None
        self.cut = (w, lengths, refill_prompt)

    def add(self, position: int, worker: int, prompt: float, k: int) -> None:
        """A request admitted at iteration ``k``: workload ``prompt + (t - k)`` at every ``t``."""
        const = float(prompt) - (k - self.k0)
        self.extra_worker[position] = worker
        self.extra_const[position] = const
        self.added.append(position)
        self.count[worker] += 1.0
        self.const[worker] += const

    def remove(self, positions: np.ndarray) -> None:
        """Requests that finished: their projected paths leave their workers."""
        rows = self.row_of[positions]
        hit = rows >= 0
        if hit.any():
            rows = rows[hit]
            self.row_of[positions[hit]] = -1
            gs = self.workers_of[rows]
            if self.paths is not None:
                np.subtract.at(self.base, gs, self.paths[rows])
            else:
                self._remove_cutoff(rows, gs)
        if not hit.all():
            rest = positions[~hit]
            ws = self.extra_worker[rest]
            mine = ws >= 0
            if mine.any():
                rest, ws = rest[mine], ws[mine]
                np.subtract.at(self.count, ws, 1.0)
                np.subtract.at(self.const, ws, self.extra_const[rest])
                self.extra_worker[rest] = -1

    def _remove_cutoff(self, rows: np.ndarray, gs: np.ndarray) -> None:
        w, lengths, refill = self.cut
        cutoff_remove(self.base, gs, w[rows], lengths[rows], -1.0 if refill is None else refill)

    def view(self, k: int, observed: np.ndarray) -> np.ndarray:
        """Projected loads ``(G, H+1)`` at offsets ``h = 0..H`` from iteration ``k``.

        Column 0 is the observed load: a request known to be alive never counts as gone.
        """
        j = k - self.k0
        out = self.base[:, j : j + self.horizon + 1].copy()
        out += self.const[:, None] + self.count[:, None] * (j + self.hs)[None, :]
        out[:, 0] = observed
        return out


@njit(cache=True, nogil=True)
def cutoff_base(workers, workload, c, horizon, g_count, length, refill):
    """Projected loads ``(G, length)`` of running requests in cutoff mode.

    Request ``i`` contributes ``W_i + t`` at offsets ``t < d_i`` with ``d_i = ceil(c_i)``
    (every offset if ``c_i >= horizon``); with ``refill >= 0`` its slot then holds a request of
    that prompt, ``refill + (t - d_i)``. Returns the base and the offsets ``d``.
    """
    n = workers.shape[0]
    ended = np.zeros((g_count, length + 1))
    ended_w = np.zeros((g_count, length + 1))
    ended_d = np.zeros((g_count, length + 1))
    alive = np.zeros(g_count)
    alive_w = np.zeros(g_count)
    d = np.empty(n, dtype=np.int64)
    for i in range(n):
        if c[i] >= horizon:
            di = length
        else:
            di = int(np.ceil(c[i]))
            di = min(max(di, 1), length)
        d[i] = di
        g = workers[i]
        alive[g] += 1.0
        alive_w[g] += workload[i]
        if di < length:
            ended[g, di] += 1.0
            ended_w[g, di] += workload[i]
            ended_d[g, di] += di
    base = np.empty((g_count, length))
    for g in range(g_count):
        cnt = alive[g]
        w = alive_w[g]
        gone = 0.0
        gone_d = 0.0
        for t in range(length):
            cnt -= ended[g, t]
            w -= ended_w[g, t]
            gone += ended[g, t]
            gone_d += ended_d[g, t]
            v = w + cnt * t
            if refill >= 0.0:
                v += gone * (refill + t) - gone_d
            base[g, t] = v
    return base, d


@njit(cache=True, nogil=True)
def cutoff_remove(base, workers, workload, lengths, refill):
    """Take finished requests' cutoff paths (and refills) out of ``base`` in place."""
    length = base.shape[1]
    for i in range(workers.shape[0]):
        g = workers[i]
        d = lengths[i]
        for t in range(d):
            base[g, t] -= workload[i] + t
        if refill >= 0.0:
            for t in range(d, length):
                base[g, t] -= refill + t - d

"""As-of queries over a completion history: each query answered from the window it would have
seen online, for every query in one Fenwick-tree sweep.

This is how the offline feature builder reproduces, for thousands of training snapshots at
once, exactly what :meth:`balanceroute.features.windows.KeyedCounts.query` answers online.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.features.windows import (
    NEEDLE_SIDES,
    OUT_MASK,
    KeyedCounts,
    key_base,
    key_needles,
    key_terms,
)


@njit(cache=True, nogil=True)
def _asof_sweep(
    slot: np.ndarray,
    out: np.ndarray,
    q_order: np.ndarray,
    q_done: np.ndarray,
    q_pos: np.ndarray,
    window: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Fenwick-tree sweep: prefix counts and output sums at ``q_pos`` as of each query's time.

    History item ``p`` (the p-th completion) sits at ``slot[p]`` of the (key, output) order, or
    nowhere (-1). Query ``q`` sees items ``max(q_done[q] - window, 0) <= p < q_done[q]``; the
    answer is, for each column ``j`` of ``q_pos``, how many of them (and their output sum) sit at
    slots below ``q_pos[q, j]``. Queries are visited in ``q_order`` (non-decreasing ``q_done``).
    """
    size = q_pos.shape[0]
    n_slots = slot.shape[0]
    cnt = np.zeros(n_slots + 1, np.int64)
    tot = np.zeros(n_slots + 1, np.int64)
    res_n = np.zeros(q_pos.shape, np.int64)
    res_s = np.zeros(q_pos.shape, np.int64)
    added = 0
    removed = 0
    for k in range(size):
        q = q_order[k]
        done = q_done[q]
        while added < done:
            i = slot[added] + 1
            if i > 0:
                v = out[added]
                while i <= n_slots:
                    cnt[i] += 1
                    tot[i] += v
                    i += i & -i
            added += 1
        while removed < done - window:
            i = slot[removed] + 1
            if i > 0:
                v = out[removed]
                while i <= n_slots:
                    cnt[i] -= 1
                    tot[i] -= v
                    i += i & -i
            removed += 1
        for j in range(q_pos.shape[1]):
            i = q_pos[q, j]
            c = 0
            s = 0
            while i > 0:
                c += cnt[i]
                s += tot[i]
                i -= i & -i
            res_n[q, j] = c
            res_s[q, j] = s
    return res_n, res_s


def _history_slots(
    hist_keys: np.ndarray, hist_out: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Capped outputs, each history item's slot in the sorted (key, output) composite order (-1
    without a key) and the sorted composite codes."""
    hist_keys = np.asarray(hist_keys, dtype=np.uint64)
    out = np.minimum(np.asarray(hist_out, dtype=np.int64), int(OUT_MASK))
    valid = hist_keys != 0
    comp = KeyedCounts.encode(hist_keys[valid], out[valid])
    srt = np.argsort(comp, kind="stable")
    slot = np.full(out.shape[0], -1, dtype=np.int64)
    slot[np.flatnonzero(valid)[srt]] = np.arange(srt.size)
    return out, slot, comp[srt]


def _sweep(
    slot: np.ndarray, out: np.ndarray, pos: np.ndarray, q_done: np.ndarray, window: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`_asof_sweep` with the queries visited in time order."""
    q_done = np.asarray(q_done, dtype=np.int64)
    order = np.argsort(q_done, kind="stable")
    return _asof_sweep(slot, out, order, q_done, pos.astype(np.int64), max(int(window), 0))


def asof_key_terms(
    hist_keys: np.ndarray,
    hist_out: np.ndarray,
    q_keys: np.ndarray,
    q_done: np.ndarray,
    ages: np.ndarray,
    horizon: int,
    window: int,
) -> tuple[np.ndarray, ...]:
    """Offline twin of :meth:`KeyedCounts.query`, each query as of its own point in history.

    ``hist_keys``/``hist_out`` are completions in the order ``observe()`` sees them; query ``q``
    is answered from the window a :class:`SlidingWindow` of ``window`` holds after the first
    ``q_done[q]`` of them, exactly as :meth:`KeyedCounts.query` would then: returns
    ``(n, S(a), S(a+H), sum_{o>a} min(o-a, H))`` as float64. O((N + Q) log N), no per-query window.
    """
    out, slot, comp = _history_slots(hist_keys, hist_out)
    q_keys = np.asarray(q_keys, dtype=np.uint64)
    ages = np.asarray(ages, dtype=np.int64)
    base = key_base(q_keys)
    pos = np.column_stack(
        [
            np.searchsorted(comp, needle, side=side)
            for needle, side in zip(key_needles(base, ages, horizon), NEEDLE_SIDES, strict=True)
        ]
    )
    cnt, tot = _sweep(slot, out, pos, q_done, window)
    start, i_a, i_b, end = (cnt[:, j] for j in range(4))
    return key_terms(q_keys == 0, start, i_a, i_b, end, tot[:, 2] - tot[:, 1], ages, horizon)


def asof_key_survival(
    hist_keys: np.ndarray,
    hist_out: np.ndarray,
    q_keys: np.ndarray,
    q_done: np.ndarray,
    ages: np.ndarray,
    offsets: np.ndarray,
    window: int,
) -> tuple[np.ndarray, np.ndarray]:
    """Offline twin of :meth:`KeyedCounts.surv_matrix` at a few offsets, each query as of its
    own point in history: the key's count ``n`` in the window and its survival counts
    ``S(a + o)`` for every offset ``o`` (``(Q, len(offsets))``, float64); zeros for queries
    without a key."""
    out, slot, comp = _history_slots(hist_keys, hist_out)
    q_keys = np.asarray(q_keys, dtype=np.uint64)
    a = np.asarray(ages, dtype=np.int64)
    base = key_base(q_keys)
    needles = [base | (a + int(o)).astype(np.uint64) for o in offsets]
    needles += [base, base | OUT_MASK]
    sides = ["right"] * len(offsets) + ["left", "right"]
    pos = np.column_stack(
        [np.searchsorted(comp, nd, side=side) for nd, side in zip(needles, sides, strict=True)]
    )
    cnt, _ = _sweep(slot, out, pos, q_done, window)
    none = q_keys == 0
    n = np.where(none, 0, cnt[:, -1] - cnt[:, -2]).astype(np.float64)
    surv = np.where(none[:, None], 0, cnt[:, -1:] - cnt[:, :-2]).astype(np.float64)
    return n, surv

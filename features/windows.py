"""Sliding windows of completions, and the survival counts the empirical estimators keep over them.

A window holds the last ``capacity`` completions of a stream in a ring: the ``p``-th completion
ever lives at slot ``p % capacity``. :func:`ring_append`, :func:`ring_leaving` and
:func:`ring_latest` are the one definition of that bookkeeping; every ring of the project (the
estimators' windows, the online feature history, the service's completion log, the online
recalibrator) uses them.

Counts: :class:`MarginalCounts` is the histogram of the window's outputs with the survival counts
``S(x) = #{outputs > x}`` and their cumulative sums; :class:`KeyedCounts` holds the same per prompt
key, as one sorted array of ``key_base | output`` codes, so a key's survival counts at any age are
two binary searches away.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.features.limits import input_limits


def ring_append(total: int, m: int, capacity: int) -> tuple[slice, np.ndarray]:
    """Where ``m`` new items go in a ring of ``capacity`` that has taken ``total`` so far: the
    slice of the batch that is kept (its last ``capacity``) and the slots they take, in order."""
    keep = slice(max(m - capacity, 0), m)
    return keep, (total + np.arange(keep.start, m)) % capacity


def ring_leaving(total: int, m: int, window: int, capacity: int) -> np.ndarray:
    """Slots of the stored items that leave a window of the last ``window`` when ``m`` more
    arrive (``window <= capacity``; items of the new batch that never fit are not stored)."""
    first = max(total - window, 0)
    stop = min(max(total + m - window, 0), total)
    return np.arange(first, stop) % capacity


def ring_latest(total: int, n: int, capacity: int) -> np.ndarray:
    """Slots of the ``n`` most recent items, oldest first."""
    return (total - n + np.arange(n)) % max(capacity, 1)


OUT_BITS = 21  # outputs are capped at 2**21 - 1 tokens inside the keyed composite
OUT_MASK = np.uint64((1 << OUT_BITS) - 1)


def mix64(keys: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: spreads any uint64 keys (small lengths included) over 64 bits."""
    z = np.asarray(keys, dtype=np.uint64).copy()
    with np.errstate(over="ignore"):
        z += np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def key_base(keys: np.ndarray) -> np.ndarray:
    """High bits of the mixed key: the key's block in the (key, output) composite order."""
    return (mix64(keys) >> np.uint64(OUT_BITS)) << np.uint64(OUT_BITS)


NEEDLE_SIDES = ("left", "right", "right", "right")


def key_needles(
    base: np.ndarray, ages: np.ndarray, horizon: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Composite codes bounding a key's outputs: its block's start, ``<= a``, ``<= a + H``, its
    end; searched with :data:`NEEDLE_SIDES` they give the positions :func:`key_terms` reads."""
    a = np.asarray(ages).astype(np.uint64)
    return base, base | a, base | (a + np.uint64(horizon)), base | OUT_MASK


def key_terms(
    none: np.ndarray,
    start: np.ndarray,
    i_a: np.ndarray,
    i_b: np.ndarray,
    end: np.ndarray,
    between: np.ndarray,
    ages: np.ndarray,
    horizon: int,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(n, S(a), S(a+H), sum_{o>a} min(o-a, H))`` of one key per row from the positions of its
    needles and ``between``, the sum of the outputs at positions ``[i_a, i_b)``; rows without a
    key (``none``) get zeros. The one definition behind the online and the as-of query."""
    n = np.where(none, 0, end - start).astype(np.float64)
    s_a = np.where(none, 0, end - i_a).astype(np.float64)
    s_b = np.where(none, 0, end - i_b).astype(np.float64)
    within = between - np.asarray(ages, dtype=np.int64) * (i_b - i_a)
    capped = np.where(none, 0.0, within + horizon * s_b)
    return n, s_a, s_b, capped


class SlidingWindow:
    """Ring buffer of the last ``capacity`` (key, output) completions; ``push`` returns evictions."""

    def __init__(self, capacity: int) -> None:
        self.capacity = int(capacity)
        self.keys = np.zeros(0, dtype=np.uint64)
        self.out = np.zeros(0, dtype=np.int64)
        self.total = 0

    def __len__(self) -> int:
        return int(self.out.size)

    def push(self, keys: np.ndarray, out: np.ndarray) -> tuple[np.ndarray, np.ndarray, slice]:
        """Append in order; returns (evicted keys, evicted outputs, slice of the batch kept).

        Logical position ``p`` (the p-th completion ever) lives at slot ``p % capacity``.
        """
        m, cap, total = int(out.shape[0]), self.capacity, self.total
        size = min(cap, total + m)
        if size > self.out.size:
            grow = size - self.out.size
            self.keys = np.concatenate([self.keys, np.zeros(grow, dtype=np.uint64)])
            self.out = np.concatenate([self.out, np.zeros(grow, dtype=np.int64)])
        gone = ring_leaving(total, m, cap, cap)
        ev_k, ev_o = self.keys[gone].copy(), self.out[gone].copy()
        keep, slots = ring_append(total, m, cap)
        self.keys[slots] = keys[keep]
        self.out[slots] = out[keep]
        self.total = total + m
        return ev_k, ev_o, keep


class MarginalCounts:
    """Histogram of outputs in the window, with lazily refreshed survival and cumulative sums.

    The histogram grows with the largest output seen up to ``cap`` and no further: outputs at or
    above ``cap`` share its last bucket (the tail), so ``S(x)`` and ``CS(x)`` are exact for
    ``x < cap`` and memory never exceeds ``O(cap)`` whatever is observed. The default cap is the
    largest accepted output (:mod:`balanceroute.features.limits`).
    """

    cap: int = 2**20  # class default: models pickled before the cap existed

    def __init__(self, cap: int | None = None) -> None:
        self.cap = int(input_limits().max_output_tokens if cap is None else cap)
        self.hist = np.zeros(2, dtype=np.int64)
        self.n = 0
        self._dirty = True

    def add(self, out: np.ndarray, sign: int = 1) -> None:
        """Add (sign=1) or remove (sign=-1) outputs; the curves are rebuilt on next use."""
        if out.size == 0:
            return
        out = np.minimum(out, self.cap)
        top = int(out.max()) + 2
        if top > self.hist.size:
            self.hist = np.concatenate([self.hist, np.zeros(top - self.hist.size, np.int64)])
        np.add.at(self.hist, out, sign)
        self.n += sign * int(out.size)
        self._dirty = True

    def _refresh(self) -> None:
        # S(x) = #outputs > x for x = 0..L-1 (zero beyond); CS(x) = sum_{y<x} S(y).
        self.surv_ = (self.n - np.cumsum(self.hist)).astype(np.float64)
        self.csurv_ = np.concatenate([[0.0], np.cumsum(self.surv_)])
        self._dirty = False

    def curves(self) -> tuple[np.ndarray, np.ndarray]:
        """The current ``(S, CS)`` tables (for compiled readers)."""
        if self._dirty:
            self._refresh()
        return self.surv_, self.csurv_

    def surv(self, x: np.ndarray) -> np.ndarray:
        """Survival counts S(x) for integer x >= 0."""
        if self._dirty:
            self._refresh()
        return self.surv_[np.minimum(x, self.surv_.size - 1)]

    def csurv(self, x: np.ndarray) -> np.ndarray:
        """Cumulative survival counts CS(x) = sum_{y<x} S(y)."""
        if self._dirty:
            self._refresh()
        return self.csurv_[np.minimum(x, self.csurv_.size - 1)]


class KeyedCounts:
    """Per-key outputs as one sorted composite array ``key_base | output`` plus output sums."""

    def __init__(self) -> None:
        self.comp = np.zeros(0, dtype=np.uint64)
        self._dirty = True

    @staticmethod
    def encode(keys: np.ndarray, out: np.ndarray) -> np.ndarray:
        """Composite codes of (key, output) pairs; key 0 (none) is the caller's to drop."""
        return key_base(keys) | np.minimum(out, int(OUT_MASK)).astype(np.uint64)

    def add(self, keys: np.ndarray, out: np.ndarray) -> None:
        """Insert completions with a key (0 = none is skipped)."""
        m = keys != 0
        if not m.any():
            return
        codes = np.sort(self.encode(keys[m], out[m]))
        self.comp = np.insert(self.comp, np.searchsorted(self.comp, codes), codes)
        self._dirty = True

    def remove(self, keys: np.ndarray, out: np.ndarray) -> None:
        """Delete completions that left the window."""
        m = keys != 0
        if not m.any():
            return
        codes = np.sort(self.encode(keys[m], out[m]))
        pos = np.searchsorted(self.comp, codes)
        # equal codes map to the same first position: offset each duplicate by its rank
        first = np.searchsorted(codes, codes)
        self.comp = np.delete(self.comp, pos + (np.arange(codes.size) - first))
        self._dirty = True

    def _refresh(self) -> None:
        vals = (self.comp & OUT_MASK).astype(np.float64)
        self.csum_ = np.concatenate([[0.0], np.cumsum(vals)])
        self._dirty = False

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """The sorted composite codes and the cumulative output sums (for compiled readers)."""
        if self._dirty:
            self._refresh()
        return self.comp, self.csum_

    def query(self, keys: np.ndarray, ages: np.ndarray, horizon: int) -> tuple[np.ndarray, ...]:
        """Per row: key count n, S(a), S(a+H), and sum over outputs o > a of min(o - a, H)."""
        if self._dirty:
            self._refresh()
        a = np.asarray(ages).astype(np.uint64)
        base = key_base(keys)
        # binary searches run faster on sorted needles: sort once, scatter back
        order = np.argsort(base | a)
        idx = np.empty((4, order.size), dtype=np.int64)
        for j, needle in enumerate(key_needles(base[order], a[order], horizon)):
            idx[j, order] = np.searchsorted(self.comp, needle, side=NEEDLE_SIDES[j])
        start, i_a, i_b, end = idx
        between = self.csum_[i_b] - self.csum_[i_a]
        return key_terms(keys == 0, start, i_a, i_b, end, between, ages, horizon)

    def surv_matrix(self, keys: np.ndarray, ages: np.ndarray, horizon: int) -> np.ndarray:
        """Survival counts S_key(a+h) for h = 0..H, shape (n, H+1)."""
        return _surv_matrix(
            self.comp,
            key_base(keys),
            np.asarray(keys, dtype=np.uint64),
            np.asarray(ages, dtype=np.int64),
            int(horizon),
        )


@njit(cache=True, nogil=True)
def _surv_matrix(comp, base, keys, ages, horizon):
    """Per row, one binary search for the key's block and the age, then a forward walk over
    the block's outputs as ``h`` grows (O(log n + H + block) instead of H + 1 searches)."""
    n = keys.shape[0]
    out = np.zeros((n, horizon + 1))
    for i in range(n):
        if keys[i] == 0:
            continue
        b = base[i]
        end = np.searchsorted(comp, b | OUT_MASK, side="right")
        a = np.uint64(ages[i])
        j = np.searchsorted(comp, b | a, side="right")
        for h in range(horizon + 1):
            limit = b | (a + np.uint64(h))
            while j < end and comp[j] <= limit:
                j += 1
            out[i, h] = float(end - j)
    return out

"""Empirical output-length distributions over a sliding window, and their conditional maths.

Everything here works on *survival counts*: ``S(x) = #{observed outputs > x}``. For a request alive
at age ``a`` (so its output ``O > a``) and remaining ``r = O - a``, with weights ``A`` on a key's
counts and ``B`` on the marginal's (normalised to a probability):

- ``P(r > h) = (A*Sk(a+h) + B*Sm(a+h)) / (A*Sk(a) + B*Sm(a))``,
- ``p_finish = 1 - P(r > H)``, ``c = sum_{h<H} P(r > h)`` from cumulative sums, O(log n) a row.

``A=0, B=1`` is the marginal (``survival``); ``A=1, B=k`` is the Dirichlet-process posterior
predictive that shrinks a key's CDF toward the marginal by its count (``n/(n+k)`` at age 0,
adapting with age because only the key's outputs above ``a`` still count); ``B=0`` is the key alone.

Rule when the denominator is 0 (the request is older than every output that still has weight):
there is no evidence about it, so it is projected to survive the window (``p_finish = 0``,
``c = H``, survival all ones), the same answer as the ``none`` estimator.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.predict.base import Prediction

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
        gone = np.arange(max(total - cap, 0), min(max(total + m - cap, 0), total)) % cap
        ev_k, ev_o = self.keys[gone].copy(), self.out[gone].copy()
        keep = slice(max(m - cap, 0), m)
        slots = (total + np.arange(keep.start, m)) % cap
        self.keys[slots] = keys[keep]
        self.out[slots] = out[keep]
        self.total = total + m
        return ev_k, ev_o, keep


class MarginalCounts:
    """Histogram of outputs in the window, with lazily refreshed survival and cumulative sums."""

    def __init__(self) -> None:
        self.hist = np.zeros(2, dtype=np.int64)
        self.n = 0
        self._dirty = True

    def add(self, out: np.ndarray, sign: int = 1) -> None:
        """Add (sign=1) or remove (sign=-1) outputs; the curves are rebuilt on next use."""
        if out.size == 0:
            return
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
        # binary searches run over twice as fast on sorted needles: sort once, scatter back
        order = np.argsort(base | a)
        sb, sa = base[order], a[order]
        needles = (sb, sb | sa, sb | (sa + np.uint64(horizon)), sb | OUT_MASK)
        idx = np.empty((4, order.size), dtype=np.int64)
        for j, needle in enumerate(needles):
            idx[j, order] = np.searchsorted(self.comp, needle, side="left" if j == 0 else "right")
        start, i_a, i_b, end = idx
        none = keys == 0
        n = np.where(none, 0, end - start).astype(np.float64)
        s_a = np.where(none, 0, end - i_a).astype(np.float64)
        s_b = np.where(none, 0, end - i_b).astype(np.float64)
        within = self.csum_[i_b] - self.csum_[i_a] - np.asarray(ages, dtype=np.int64) * (i_b - i_a)
        capped = np.where(none, 0.0, within + horizon * s_b)
        return n, s_a, s_b, capped

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


@njit(cache=True, nogil=True, inline="always")
def mixed_count(surv, key_surv, i, x, h, bw, aw):
    """``bw * S_m(x) + aw * S_k[i, h]`` (the key's term only when ``key_surv`` has rows)."""
    num = bw * surv[min(x, surv.shape[0] - 1)]
    if key_surv.shape[0] > 0:
        num = num + aw * key_surv[i, h]
    return num


@njit(cache=True, nogil=True, inline="always")
def clip01(v):
    return 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)


@njit(cache=True, nogil=True)
def _conditional_curves(surv, ages, horizon, bw, aw, key_surv, alive, safe):
    """``P(r > h)``, h = 0..H: ``(bw * S_m(a+h) + aw * S_k(a+h)) / safe`` clipped to [0, 1],
    1 where nothing is known (``alive`` false) and at h = 0; no (n, H+1) temporaries."""
    n = ages.shape[0]
    out = np.ones((n, horizon + 1))
    for i in range(n):
        if alive[i]:
            for h in range(1, horizon + 1):
                num = mixed_count(surv, key_surv, i, ages[i] + h, h, bw[i], aw[i])
                out[i, h] = clip01(num / safe[i])
    return out


def conditional_prediction(
    marginal: MarginalCounts,
    ages: np.ndarray,
    horizon: int,
    *,
    key_weight: np.ndarray | float = 0.0,
    marg_weight: np.ndarray | float = 1.0,
    key_terms: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
    key_surv: np.ndarray | None = None,
    survival: bool = False,
) -> Prediction:
    """``p_finish``, ``c`` (and survival curves) from weighted key and marginal survival counts.

    ``key_terms`` is ``(S_key(a), S_key(a+H), sum_{o>a} min(o-a, H))`` from
    :meth:`KeyedCounts.query`; ``key_surv`` the matching ``(n, H+1)`` matrix when curves are
    wanted. Marginal counts are divided by the window size so ``marg_weight`` is a pseudo-count.
    """
    ages = ages.astype(np.int64)
    h = int(horizon)
    nm = max(marginal.n, 1)
    bw = np.asarray(marg_weight, dtype=np.float64) / nm
    aw = np.asarray(key_weight, dtype=np.float64)
    sm_a, sm_b = marginal.surv(ages), marginal.surv(ages + h)
    cm = marginal.csurv(ages + h) - marginal.csurv(ages)
    den = bw * sm_a
    num_b = bw * sm_b
    num_c = bw * cm
    if key_terms is not None:
        sk_a, sk_b, ck = key_terms
        den = den + aw * sk_a
        num_b = num_b + aw * sk_b
        num_c = num_c + aw * ck
    alive = den > 0
    safe = np.where(alive, den, 1.0)
    p = np.where(alive, 1.0 - num_b / safe, 0.0)
    c = np.where(alive, num_c / safe, float(h))
    curves = None
    if survival:
        surv_table, _ = marginal.curves()
        curves = _conditional_curves(
            surv_table,
            np.ascontiguousarray(ages),
            h,
            np.ascontiguousarray(np.broadcast_to(bw, ages.shape), dtype=np.float64),
            np.ascontiguousarray(np.broadcast_to(aw, ages.shape), dtype=np.float64),
            np.zeros((0, 0)) if key_surv is None else np.ascontiguousarray(key_surv),
            np.ascontiguousarray(alive),
            np.ascontiguousarray(safe),
        )
        p = 1.0 - curves[:, h]
        c = curves[:, :h].sum(axis=1) if h > 0 else np.zeros(ages.size)
    return Prediction(p_finish=np.clip(p, 0.0, 1.0), c=np.clip(c, min(1.0, h), h), survival=curves)


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
    hist_keys = np.asarray(hist_keys, dtype=np.uint64)
    out = np.minimum(np.asarray(hist_out, dtype=np.int64), int(OUT_MASK))
    q_keys = np.asarray(q_keys, dtype=np.uint64)
    ages = np.asarray(ages, dtype=np.int64)
    valid = hist_keys != 0
    comp = KeyedCounts.encode(hist_keys[valid], out[valid])
    srt = np.argsort(comp, kind="stable")
    slot = np.full(out.shape[0], -1, dtype=np.int64)
    slot[np.flatnonzero(valid)[srt]] = np.arange(srt.size)
    comp = comp[srt]
    base = key_base(q_keys)
    a = ages.astype(np.uint64)
    pos = np.column_stack(
        [
            np.searchsorted(comp, base, side="left"),
            np.searchsorted(comp, base | a, side="right"),
            np.searchsorted(comp, base | (a + np.uint64(horizon)), side="right"),
            np.searchsorted(comp, base | OUT_MASK, side="right"),
        ]
    ).astype(np.int64)
    q_done = np.asarray(q_done, dtype=np.int64)
    cnt, tot = _asof_sweep(
        slot, out, np.argsort(q_done, kind="stable"), q_done, pos, max(int(window), 0)
    )
    none = q_keys == 0
    start, i_a, i_b, end = (cnt[:, j] for j in range(4))
    n = np.where(none, 0, end - start).astype(np.float64)
    s_a = np.where(none, 0, end - i_a).astype(np.float64)
    s_b = np.where(none, 0, end - i_b).astype(np.float64)
    within = (tot[:, 2] - tot[:, 1]) - ages * (i_b - i_a)
    capped = np.where(none, 0.0, within + horizon * s_b)
    return n, s_a, s_b, capped

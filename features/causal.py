"""Causal features for (request, age) snapshots: only what was knowable at the snapshot time.

One definition, two implementations that must agree value for value:

- :func:`snapshot_features` builds features offline from a whole trace (training, evaluation);
- :class:`OnlineHistory` keeps bounded state updated by ``observe()`` of finished requests and
  builds the same features at predict time (router, HTTP service).

Timing model for a trace (documented parameters of :class:`CausalConfig`): request ``i`` starts
decoding at ``start_i = arrival_i + prompt_i / prefill_tokens_per_s`` and finishes at
``start_i + output_i * assumed_tpot_s``; its snapshot at age ``a`` happens at
``start_i + a * assumed_tpot_s``. "History" is the set of requests that FINISHED strictly before
the snapshot time, restricted to the most recent ``window`` of them (what ``observe()`` keeps), so
a future request's output can never leak into a past feature.

Features (column order :attr:`CausalConfig.feature_names`): prompt size, age, EWMAs of finished
output lengths (half-lives counted in completions), mean and std of the last ``recent`` outputs,
mean of their prompts, completions per second over the last ``rate_window_s`` seconds, and for
each key source (exact prompt length, prompt hash) and each key window (the whole window and
shorter recent ones, since workloads drift): count, mean, std and last output of the same key,
plus mean and last minus age, and the seconds since the key's last completion. Last, the
empirical survival estimators' own answers at the snapshot's age, stacked as features: for the
marginal and each key source, over ``window`` and over the shorter ``cond_windows`` (workloads
drift), the number of outputs above the age, the conditional finish probability ``P(r <= H)`` and
capped expectation ``E[min(r, H)]``; for each key source also ``exactmatch``'s shrunk estimate
(the key's counts blended with the marginal's with ``em_prior`` pseudo-observations). Offline these
come from an as-of Fenwick sweep (:func:`predict.empirical.asof_key_terms`), online from the same
:class:`predict.empirical.KeyedCounts` and :class:`predict.empirical.MarginalCounts` the empirical
estimators keep.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from balanceroute.features.causal_kernels import key_table_columns, keyed_columns, marginal_columns
from balanceroute.features.schema import TraceArrays
from balanceroute.predict.empirical import (
    OUT_MASK,
    KeyedCounts,
    MarginalCounts,
    asof_key_terms,
    key_base,
)
from balanceroute.predict.keys import derive_keys

GLOBAL_FEATURES: tuple[str, ...] = (
    "recent_out_mean",
    "recent_out_std",
    "recent_in_mean",
    "finish_rate",
)
KEY_STATS: tuple[str, ...] = ("count", "mean", "std", "last", "mean_minus_age", "last_minus_age")
COND_STATS: tuple[str, ...] = ("cond_alive", "cond_p", "cond_c")
EM_STATS: tuple[str, ...] = ("em_p", "em_c")


@dataclass(frozen=True, slots=True)
class CausalConfig:
    """Parameters shared by the offline builder and the online state."""

    assumed_tpot_s: float = 0.06  # seconds per decode step (the paper's engine step)
    prefill_tokens_per_s: float = 10_000.0  # prefill estimate: prompt / rate seconds
    window: int = 131_072  # completions kept for rolling and per-key statistics
    key_windows: tuple[int, ...] = (4096, 512)  # shorter per-key windows, besides ``window``
    recent: int = 256  # completions in the rolling output/input statistics
    ewma_halflives: tuple[int, ...] = (16, 256)  # in completions
    rate_window_s: float = 60.0  # seconds for the completion-rate statistic
    key_sources: tuple[str, ...] = ("exact-length", "hash")
    horizon: int = 80  # H of the conditional finish features
    cond_windows: tuple[int, ...] = (1024,)  # shorter windows of the conditional features
    em_prior: float = 2.0  # pseudo-observations of the marginal in the shrunk key estimate
    feature_names: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.recent <= self.window:
            raise ValueError("need 1 <= recent <= window")
        if any(not 1 <= w <= self.window for w in (*self.key_windows, *self.cond_windows)):
            raise ValueError("need 1 <= key window <= window")
        names = ["prompt_tokens", "age"]
        names += [f"ewma_out_{h}" for h in self.ewma_halflives]
        names += list(GLOBAL_FEATURES)
        names += [f"{src}_w{w}_{stat}" for src, w in self.key_tables for stat in KEY_STATS]
        names += [f"{src}_since_last_s" for src in self.key_sources]
        for w in self.cond_tables:
            names += [f"marginal_w{w}_{stat}" for stat in COND_STATS]
            names += [
                f"{src}_w{w}_{st}" for src in self.key_sources for st in COND_STATS + EM_STATS
            ]
        object.__setattr__(self, "feature_names", tuple(names))

    @property
    def cond_tables(self) -> tuple[int, ...]:
        """Windows of the conditional (stacked empirical) features, without repeats."""
        return tuple(dict.fromkeys((self.window, *self.cond_windows)))

    @property
    def key_tables(self) -> tuple[tuple[str, int], ...]:
        """(key source, window) of every per-key statistic table."""
        wins = (self.window, *self.key_windows)
        return tuple((src, w) for src in self.key_sources for w in wins)

    def decode_start(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
        """Estimated decode start times: arrival plus the prefill estimate."""
        prefill = 0.0 if self.prefill_tokens_per_s <= 0 else 1.0 / self.prefill_tokens_per_s
        return arrival_s + prompt_tokens * prefill

    def finish_times(self, trace: TraceArrays) -> np.ndarray:
        """Estimated finish time of every request of a trace."""
        start = self.decode_start(trace.arrival_s, trace.prompt_tokens)
        return start + trace.output_tokens * self.assumed_tpot_s

    def snapshot_times(self, trace: TraceArrays, index: np.ndarray, age: np.ndarray) -> np.ndarray:
        """Time at which request ``index`` has generated ``age`` tokens."""
        start = self.decode_start(trace.arrival_s[index], trace.prompt_tokens[index])
        return start + age * self.assumed_tpot_s


def _alpha(halflife: int) -> float:
    return 1.0 - 0.5 ** (1.0 / max(int(halflife), 1))


def _ewma_run(x: np.ndarray, alpha: float, state: float) -> np.ndarray:
    """EWMA after each element of ``x``, starting from ``state`` (NaN = no history yet)."""
    x = x.astype(np.float64)
    if np.isnan(state):
        state = float(x[0])
    return _ewma_kernel(x, alpha, state)


@njit(cache=True, nogil=True)
def _ewma_kernel(x: np.ndarray, alpha: float, state: float) -> np.ndarray:
    """``y_n = alpha * x_n + (1 - alpha) * y_{n-1}``, ``y_{-1} = state`` (scipy's lfilter order
    of operations, without importing scipy.signal into the server)."""
    out = np.empty_like(x)
    keep = 1.0 - alpha
    z = keep * state
    for i in range(x.shape[0]):
        y = alpha * x[i] + z
        out[i] = y
        z = keep * y
    return out


def _key_stats(
    count: np.ndarray, s1: np.ndarray, s2: np.ndarray, last: np.ndarray, age: np.ndarray
) -> list[np.ndarray]:
    """Per-key feature columns (KEY_STATS order) from integer window sums; NaN without history."""
    c = count.astype(np.float64)
    has = c > 0
    safe = np.where(has, c, 1.0)
    mean = np.where(has, s1 / safe, np.nan)
    var = np.where(has, s2 / safe - (s1 / safe) ** 2, np.nan)
    std = np.sqrt(np.clip(var, 0.0, None))
    lastf = np.where(has, last.astype(np.float64), np.nan)
    a = age.astype(np.float64)
    return [c, mean, std, lastf, mean - a, lastf - a]


def _global_stats(
    cnt: np.ndarray, out_sum: np.ndarray, out_sq: np.ndarray, in_sum: np.ndarray
) -> list[np.ndarray]:
    """Rolling output mean/std and input mean (GLOBAL_FEATURES order; the rate comes apart)."""
    c = cnt.astype(np.float64)
    has = c > 0
    safe = np.where(has, c, 1.0)
    mean = np.where(has, out_sum / safe, np.nan)
    var = np.where(has, out_sq / safe - (out_sum / safe) ** 2, np.nan)
    return [mean, np.sqrt(np.clip(var, 0.0, None)), np.where(has, in_sum / safe, np.nan)]


def _rate(n_in_window: np.ndarray, cfg: CausalConfig) -> np.ndarray:
    return n_in_window.astype(np.float64) / cfg.rate_window_s


def _cond_columns(
    marginal: tuple[np.ndarray, ...], keyed: list[tuple[np.ndarray, ...]], cfg: CausalConfig
) -> list[np.ndarray]:
    """COND_STATS of the marginal, then COND_STATS + EM_STATS per key source.

    Every input is ``(n, S(a), S(a+H), sum_{o>a} min(o-a, H))`` over the window, from
    :meth:`KeyedCounts.query` (online) or :func:`asof_key_terms` (offline); NaN without evidence.
    """
    nm, sm_a, sm_b, cm = marginal
    cols = []

    def cond(s_a: np.ndarray, s_b: np.ndarray, capped: np.ndarray) -> None:
        has = s_a > 0
        safe = np.where(has, s_a, 1.0)
        cols.extend(
            [s_a, np.where(has, 1.0 - s_b / safe, np.nan), np.where(has, capped / safe, np.nan)]
        )

    cond(sm_a, sm_b, cm)
    bw = cfg.em_prior / np.maximum(nm, 1.0)
    for _, s_a, s_b, capped in keyed:
        cond(s_a, s_b, capped)
        den = s_a + bw * sm_a
        has = den > 0
        safe = np.where(has, den, 1.0)
        cols.append(np.where(has, 1.0 - (s_b + bw * sm_b) / safe, np.nan))
        cols.append(np.where(has, (capped + bw * cm) / safe, np.nan))
    return cols


def _cumsum0(x: np.ndarray) -> np.ndarray:
    out = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out


def snapshot_features(
    history: TraceArrays,
    time_s: np.ndarray,
    prompt_tokens: np.ndarray,
    age: np.ndarray,
    prompt_key: np.ndarray | None,
    cfg: CausalConfig,
) -> np.ndarray:
    """Feature matrix ``(n, F)`` for snapshots at ``time_s`` given a trace's finished requests.

    Only history requests whose estimated finish time is strictly before a snapshot's time, and
    among those the latest ``cfg.window``, contribute to that snapshot's features.
    """
    finish = cfg.finish_times(history)
    order = np.argsort(finish, kind="stable")
    fin_sorted = finish[order]
    out = history.output_tokens[order].astype(np.int64)
    inp = history.prompt_tokens[order].astype(np.int64)
    n_hist = out.shape[0]
    time_s = np.asarray(time_s, dtype=np.float64)
    n_done = np.searchsorted(fin_sorted, time_s, side="left")
    lo_win = np.maximum(n_done - cfg.window, 0)

    cols = [prompt_tokens.astype(np.float64), age.astype(np.float64)]
    for hl in cfg.ewma_halflives:
        e = np.full(n_hist + 1, np.nan)
        if n_hist:
            e[1:] = _ewma_run(out, _alpha(hl), np.nan)
        cols.append(e[n_done])

    lo_rec = np.maximum(n_done - cfg.recent, 0)
    cs_out, cs_sq, cs_in = _cumsum0(out), _cumsum0(out * out), _cumsum0(inp)
    glob = _global_stats(
        n_done - lo_rec,
        cs_out[n_done] - cs_out[lo_rec],
        cs_sq[n_done] - cs_sq[lo_rec],
        cs_in[n_done] - cs_in[lo_rec],
    )
    first_in_rate = np.searchsorted(fin_sorted, time_s - cfg.rate_window_s, side="left")
    rate = _rate(n_done - np.maximum(first_in_rate, lo_win), cfg)
    cols += [*glob, rate]

    hist_keys = {
        src: derive_keys(src, history.prompt_tokens, history.prompt_key)[order]
        for src in cfg.key_sources
    }
    q_keys = {src: derive_keys(src, prompt_tokens, prompt_key) for src in cfg.key_sources}
    since = []
    for src in cfg.key_sources:
        wins = [w for s, w in cfg.key_tables if s == src]
        blocks, last_fin = _offline_key_stats(
            hist_keys[src], out, fin_sorted, q_keys[src], n_done, wins, age
        )
        cols += [c for block in blocks for c in block]
        since.append(time_s - last_fin)
    cols += since
    ones = np.ones(n_hist, dtype=np.uint64)
    q_ones = np.ones(age.shape[0], dtype=np.uint64)
    h = cfg.horizon
    for w in cfg.cond_tables:
        marginal = asof_key_terms(ones, out, q_ones, n_done, age, h, w)
        keyed = [
            asof_key_terms(hist_keys[src], out, q_keys[src], n_done, age, h, w)
            for src in cfg.key_sources
        ]
        cols += _cond_columns(marginal, keyed, cfg)
    return np.column_stack(cols)


def _offline_key_stats(
    hist_keys: np.ndarray,
    out: np.ndarray,
    fin: np.ndarray,
    q_keys: np.ndarray,
    n_done: np.ndarray,
    windows: list[int],
    age: np.ndarray,
) -> tuple[list[np.ndarray], np.ndarray]:
    """Per-key window sums, one block per window, by one composite sort: (key id, rank).

    Also the finish time of the key's last completion in the first (whole) window, NaN if none.
    """
    valid = hist_keys != 0
    uniq = np.unique(hist_keys[valid])
    if uniq.size == 0:
        z = np.zeros(q_keys.shape[0], dtype=np.int64)
        return [_key_stats(z, z, z, z, age) for _ in windows], np.full(q_keys.shape[0], np.nan)
    stride = np.int64(out.shape[0] + 1)
    ranks = np.flatnonzero(valid).astype(np.int64)
    comp = np.searchsorted(uniq, hist_keys[valid]).astype(np.int64) * stride + ranks
    srt = np.argsort(comp, kind="stable")
    comp = comp[srt]
    k_out = out[valid][srt]
    k_fin = fin[valid][srt]
    cs1, cs2 = _cumsum0(k_out), _cumsum0(k_out * k_out)

    kid_q = np.minimum(np.searchsorted(uniq, q_keys), uniq.size - 1)
    found = (q_keys != 0) & (uniq[kid_q] == q_keys)
    base = kid_q.astype(np.int64) * stride
    hi = np.searchsorted(comp, base + n_done, side="left")
    last_all = k_out[np.maximum(hi - 1, 0)]
    last_fin = np.full(q_keys.shape[0], np.nan)
    blocks = []
    for j, w in enumerate(windows):
        lo = np.searchsorted(comp, base + np.maximum(n_done - w, 0), side="left")
        cnt = np.where(found, hi - lo, 0)
        s1 = np.where(found, cs1[hi] - cs1[lo], 0)
        s2 = np.where(found, cs2[hi] - cs2[lo], 0)
        blocks.append(_key_stats(cnt, s1, s2, np.where(cnt > 0, last_all, 0), age))
        if j == 0:
            last_fin = np.where(cnt > 0, k_fin[np.maximum(hi - 1, 0)], np.nan)
    return blocks, last_fin


def trace_snapshot_features(
    trace: TraceArrays, index: np.ndarray, age: np.ndarray, cfg: CausalConfig
) -> np.ndarray:
    """Features of snapshots of a trace's own requests (rows ``index`` at ``age``)."""
    return snapshot_features(
        trace,
        cfg.snapshot_times(trace, index, age),
        trace.prompt_tokens[index],
        age,
        trace.prompt_key[index],
        cfg,
    )


class KeyWindowTable:
    """Per-key integer sums over the completions in the window; keys kept sorted for lookup."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.uint64)
        self.count = np.zeros(0, dtype=np.int64)
        self.s1 = np.zeros(0, dtype=np.int64)
        self.s2 = np.zeros(0, dtype=np.int64)
        self.last = np.zeros(0, dtype=np.int64)
        self.last_time = np.zeros(0, dtype=np.float64)

    def __len__(self) -> int:
        return int(self.keys.size)

    def add(self, keys: np.ndarray, out: np.ndarray, times: np.ndarray) -> None:
        """Add completions (in finish order) with their finish times; key 0 (none) is skipped."""
        m = keys != 0
        keys, out, times = keys[m], out[m], times[m]
        if keys.size == 0:
            return
        uniq, first_rev = np.unique(keys[::-1], return_index=True)
        last_idx = keys.size - 1 - first_rev
        at = np.searchsorted(self.keys, uniq)
        known = np.zeros(uniq.size, dtype=np.bool_)
        inside = at < self.keys.size
        known[inside] = self.keys[at[inside]] == uniq[inside]
        if not known.all():  # new keys: insert them (zero sums) in sorted place, O(table)
            where = at[~known]
            self.keys = np.insert(self.keys, where, uniq[~known])
            for name in ("count", "s1", "s2", "last", "last_time"):
                old = getattr(self, name)
                setattr(self, name, np.insert(old, where, old.dtype.type(0)))
        pos = np.searchsorted(self.keys, keys)
        np.add.at(self.count, pos, 1)
        np.add.at(self.s1, pos, out)
        np.add.at(self.s2, pos, out * out)
        at = np.searchsorted(self.keys, uniq)
        self.last[at] = out[last_idx]
        self.last_time[at] = times[last_idx]

    def remove(self, keys: np.ndarray, out: np.ndarray) -> None:
        """Remove completions that left the window; keys with no completion left are dropped."""
        m = keys != 0
        keys, out = keys[m], out[m]
        if keys.size == 0:
            return
        pos = np.searchsorted(self.keys, keys)
        np.subtract.at(self.count, pos, 1)
        np.subtract.at(self.s1, pos, out)
        np.subtract.at(self.s2, pos, out * out)
        keep = self.count > 0
        if not keep.all():
            for name in ("keys", "count", "s1", "s2", "last", "last_time"):
                setattr(self, name, getattr(self, name)[keep])


class OnlineHistory:
    """Bounded state of recent completions that yields :func:`snapshot_features`' features.

    A ring buffer of the last ``cfg.window`` completions, running EWMAs and one
    :class:`KeyWindowTable` per key source: memory never exceeds O(window).
    """

    def __init__(self, cfg: CausalConfig) -> None:
        self.cfg = cfg
        w = cfg.window
        self.out = np.zeros(w, dtype=np.int64)
        self.inp = np.zeros(w, dtype=np.int64)
        self.time = np.full(w, np.nan)
        self.keys = {src: np.zeros(w, dtype=np.uint64) for src in cfg.key_sources}
        self.tables = {kt: KeyWindowTable() for kt in cfg.key_tables}
        self.keyed = {(src, w): KeyedCounts() for w in cfg.cond_tables for src in cfg.key_sources}
        self.marginal = {w: MarginalCounts() for w in cfg.cond_tables}
        self.ewma = np.full(len(cfg.ewma_halflives), np.nan)
        self.size = 0  # valid entries (<= window)
        self.total = 0  # completions ever observed

    def observe(
        self,
        prompt_tokens: np.ndarray,
        output_tokens: np.ndarray,
        prompt_key: np.ndarray | None,
        time_s: np.ndarray | None,
    ) -> None:
        """Add finished requests, in finish order."""
        out = np.asarray(output_tokens, dtype=np.int64)
        m = out.shape[0]
        if m == 0:
            return
        inp = np.asarray(prompt_tokens, dtype=np.int64)
        times = np.full(m, np.nan) if time_s is None else np.asarray(time_s, dtype=np.float64)
        for j, hl in enumerate(self.cfg.ewma_halflives):
            self.ewma[j] = _ewma_run(out, _alpha(hl), float(self.ewma[j]))[-1]
        w = self.cfg.window
        keep = slice(max(m - w, 0), m)
        k = min(m, w)
        slots = (self.total + m - k + np.arange(k)) % w  # logical position p lives at p % w
        new_keys = {src: derive_keys(src, inp, prompt_key) for src in self.cfg.key_sources}
        for (src, win), table in self.tables.items():
            # logical positions leaving this window: [total - win, total + m - win) seen so far
            first = max(self.total - win, 0)
            stop = min(max(self.total + m - win, 0), self.total)
            gone = np.arange(first, stop) % w
            table.remove(self.keys[src][gone], self.out[gone])
            entering = slice(max(m - win, 0), m)
            table.add(new_keys[src][entering], out[entering], times[entering])
        for win in self.cfg.cond_tables:
            gone, entering = self._leaving(win, m), slice(max(m - win, 0), m)
            for src in self.cfg.key_sources:
                keyed = self.keyed[(src, win)]
                keyed.remove(self.keys[src][gone], self.out[gone])
                keyed.add(new_keys[src][entering], out[entering])
            self.marginal[win].add(self.out[gone], -1)
            self.marginal[win].add(out[entering], 1)
        for src in self.cfg.key_sources:
            self.keys[src][slots] = new_keys[src][keep]
        self.out[slots], self.inp[slots], self.time[slots] = out[keep], inp[keep], times[keep]
        self.size = min(self.size + k, w)
        self.total += m

    def _leaving(self, win: int, m: int) -> np.ndarray:
        """Slots of stored completions that leave a ``win`` window when ``m`` more arrive."""
        first = max(self.total - win, 0)
        stop = min(max(self.total + m - win, 0), self.total)
        return np.arange(first, stop) % self.cfg.window

    def _recent_slots(self, n: int) -> np.ndarray:
        return (self.total - n + np.arange(n)) % self.cfg.window

    def features(
        self,
        time_s: float | None,
        prompt_tokens: np.ndarray,
        age: np.ndarray,
        prompt_key: np.ndarray | None,
    ) -> np.ndarray:
        """Feature matrix ``(n, F)`` at ``time_s`` from the observed completions.

        Column-major, so the compiled forest scores it without a copy; the per-key and
        conditional columns are written by the kernels of :mod:`features.causal_kernels`.
        """
        n = age.shape[0]
        cfg = self.cfg
        a = np.ascontiguousarray(age, dtype=np.int64)
        x = np.empty((n, len(cfg.feature_names)), order="F")
        x[:, 0] = prompt_tokens
        x[:, 1] = a
        col = 2
        for e in self.ewma:
            x[:, col] = e
            col += 1
        rec = self._recent_slots(min(self.size, cfg.recent))
        o, i = self.out[rec], self.inp[rec]
        glob = _global_stats(
            np.array([rec.size]),
            np.array([o.sum()]),
            np.array([(o * o).sum()]),
            np.array([i.sum()]),
        )
        if time_s is None:
            rate = np.nan
        else:
            # the stored completions are ring slots [0, size): counting needs no order
            recent = np.count_nonzero(self.time[: self.size] >= time_s - cfg.rate_window_s)
            rate = float(_rate(recent, cfg))
        for value in (*(float(g[0]) for g in glob), rate):
            x[:, col] = value
            col += 1
        queries = {
            src: np.ascontiguousarray(derive_keys(src, prompt_tokens, prompt_key))
            for src in cfg.key_sources
        }
        bases = {src: key_base(q) for src, q in queries.items()}
        # rows in key (and age) order: neighbouring searches share their path, which pays on
        # big batches (4,096 rows: 0.97 M predictions/s against 0.78 M unsorted)
        by_key = {src: np.argsort(q, kind="stable") for src, q in queries.items()}
        by_key_age = {src: np.argsort(b | a.astype(np.uint64)) for src, b in bases.items()}
        now = np.nan if time_s is None else float(time_s)
        since_col = {
            src: col + 6 * len(cfg.key_tables) + j for j, src in enumerate(cfg.key_sources)
        }
        for (src, win), t in self.tables.items():
            key_table_columns(
                t.keys,
                t.count,
                t.s1,
                t.s2,
                t.last,
                t.last_time,
                queries[src],
                by_key[src],
                a,
                x,
                col,
                now,
                since_col[src] if win == cfg.window else -1,
            )
            col += 6
        col += len(cfg.key_sources)
        h = int(cfg.horizon)
        for win in cfg.cond_tables:
            mc = self.marginal[win]
            surv, csurv = mc.curves()
            marginal_columns(surv, csurv, a, h, x, col)
            col += len(COND_STATS)
            for src in cfg.key_sources:
                comp, csum = self.keyed[(src, win)].tables()
                keyed_columns(
                    comp,
                    csum,
                    bases[src],
                    queries[src],
                    by_key_age[src],
                    a,
                    h,
                    OUT_MASK,
                    surv,
                    csurv,
                    float(mc.n),
                    float(cfg.em_prior),
                    x,
                    col,
                )
                col += len(COND_STATS) + len(EM_STATS)
        return x


def training_rows(
    output_tokens: np.ndarray,
    *,
    step: int = 8,
    per_request: int = 32,
    max_rows: int = 1_000_000,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request index, age, weight) training snapshots: ages on the grid ``0, step, 2*step, ...``.

    Each request keeps at most ``per_request`` grid ages, one drawn in each of that many equal
    strata of its grid (so they stay spread over its life), and the weights ``1/rows`` give every
    request the same total weight, like the evaluation's per-request snapshots. When the rows
    exceed ``max_rows``, a seeded random subset of requests is kept: the history features still
    come from every request, only the rows are thinned. Nothing of size (requests x grid) is built.
    """
    out = np.asarray(output_tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    grid = -(-out // step)  # ages 0, step, ... strictly below the output length
    k = np.minimum(grid, per_request)
    req = np.arange(out.size)
    if k.sum() > max_rows:
        keep = np.sort(rng.permutation(out.size)[: max(int(max_rows // max(k.mean(), 1)), 1)])
        req, k, grid = req[keep], k[keep], grid[keep]
    rows_req = np.repeat(req, k)
    j = np.arange(rows_req.size) - np.repeat(np.cumsum(k) - k, k)
    g = np.repeat(grid, k)
    kk = np.repeat(k, k)
    age = step * np.floor((j + rng.random(rows_req.size)) * g / kk).astype(np.int64)
    return rows_req, np.minimum(age, out[rows_req] - 1), 1.0 / kk

"""Causal features online: bounded state of recent completions, updated by ``observe()``, that
yields the offline builder's features at predict time (router, HTTP service)."""

from __future__ import annotations

import numpy as np

from balanceroute.features.causal.columns import (
    completion_rate,
    conversation_columns,
    ewma_alpha,
    ewma_run,
    global_stat_columns,
)
from balanceroute.features.causal.config import COND_STATS, EM_STATS, CausalConfig
from balanceroute.features.causal.kernels import (
    key_table_columns,
    keyed_columns,
    marginal_columns,
)
from balanceroute.features.causal.periods import bin_hazard_columns, bin_offsets, stack_periods
from balanceroute.features.keys import derive_keys
from balanceroute.features.windows import (
    OUT_MASK,
    KeyedCounts,
    MarginalCounts,
    key_base,
    ring_append,
    ring_latest,
    ring_leaving,
)

PER_KEY = ("count", "s1", "s2", "last", "last_time", "last_prompt")


class KeyWindowTable:
    """Per-key integer sums over the completions in the window; keys kept sorted for lookup."""

    def __init__(self) -> None:
        self.keys = np.zeros(0, dtype=np.uint64)
        self.count = np.zeros(0, dtype=np.int64)
        self.s1 = np.zeros(0, dtype=np.int64)
        self.s2 = np.zeros(0, dtype=np.int64)
        self.last = np.zeros(0, dtype=np.int64)
        self.last_time = np.zeros(0, dtype=np.float64)
        self.last_prompt = np.zeros(0, dtype=np.int64)

    def __setstate__(self, state: dict) -> None:
        """Tables pickled before ``last_prompt`` existed get zeros (nothing reads them)."""
        state.setdefault("last_prompt", np.zeros(state["keys"].size, dtype=np.int64))
        self.__dict__.update(state)

    def __len__(self) -> int:
        return int(self.keys.size)

    def add(
        self,
        keys: np.ndarray,
        out: np.ndarray,
        times: np.ndarray,
        prompts: np.ndarray | None = None,
    ) -> None:
        """Add completions (in finish order) with their finish times and prompt sizes; key 0
        (none) is skipped."""
        m = keys != 0
        prompts = np.zeros(keys.size, dtype=np.int64) if prompts is None else prompts
        keys, out, times, prompts = keys[m], out[m], times[m], prompts[m]
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
            for name in PER_KEY:
                old = getattr(self, name)
                setattr(self, name, np.insert(old, where, old.dtype.type(0)))
        pos = np.searchsorted(self.keys, keys)
        np.add.at(self.count, pos, 1)
        np.add.at(self.s1, pos, out)
        np.add.at(self.s2, pos, out * out)
        at = np.searchsorted(self.keys, uniq)
        self.last[at] = out[last_idx]
        self.last_time[at] = times[last_idx]
        self.last_prompt[at] = prompts[last_idx]

    def last_of(self, keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Prompt and output of each key's last completion (NaN for key 0 or an unseen key)."""
        nan = np.full(keys.size, np.nan)
        if self.keys.size == 0:
            return nan, nan
        at = np.minimum(np.searchsorted(self.keys, keys), self.keys.size - 1)
        has = (keys != 0) & (self.keys[at] == keys)
        return np.where(has, self.last_prompt[at], nan), np.where(has, self.last[at], nan)

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
            for name in ("keys", *PER_KEY):
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
            self.ewma[j] = ewma_run(out, ewma_alpha(hl), float(self.ewma[j]))[-1]
        w = self.cfg.window
        keep, slots = ring_append(self.total, m, w)
        new_keys = {src: derive_keys(src, inp, prompt_key) for src in self.cfg.key_sources}
        for (src, win), table in self.tables.items():
            gone = ring_leaving(self.total, m, win, w)
            table.remove(self.keys[src][gone], self.out[gone])
            entering = ring_append(self.total, m, win)[0]
            table.add(new_keys[src][entering], out[entering], times[entering], inp[entering])
        for win in self.cfg.cond_tables:
            gone = ring_leaving(self.total, m, win, w)
            entering = ring_append(self.total, m, win)[0]
            for src in self.cfg.key_sources:
                keyed = self.keyed[(src, win)]
                keyed.remove(self.keys[src][gone], self.out[gone])
                keyed.add(new_keys[src][entering], out[entering])
            self.marginal[win].add(self.out[gone], -1)
            self.marginal[win].add(out[entering], 1)
        for src in self.cfg.key_sources:
            self.keys[src][slots] = new_keys[src][keep]
        self.out[slots], self.inp[slots], self.time[slots] = out[keep], inp[keep], times[keep]
        self.size = min(self.size + m, w)
        self.total += m

    def features(
        self,
        time_s: float | None,
        prompt_tokens: np.ndarray,
        age: np.ndarray,
        prompt_key: np.ndarray | None,
    ) -> np.ndarray:
        """Feature matrix ``(n, F)`` at ``time_s`` from the observed completions.

        Column-major, so the compiled forest scores it without a copy; the per-key and
        conditional columns are written by the kernels of :mod:`balanceroute.features.causal.kernels`.
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
        col = self._global_columns(x, col, time_s)
        queries = {
            src: np.ascontiguousarray(derive_keys(src, prompt_tokens, prompt_key))
            for src in cfg.key_sources
        }
        bases = {src: key_base(q) for src, q in queries.items()}
        col = self._key_columns(x, col, queries, a, time_s)
        col = self._conditional_columns(x, col, queries, bases, a)
        for src in cfg.conversation_sources:
            last_prompt, last_out = self.tables[(src, cfg.window)].last_of(queries[src])
            for c in conversation_columns(np.asarray(prompt_tokens), last_prompt, last_out):
                x[:, col] = c
                col += 1
        return x

    def _global_columns(self, x: np.ndarray, col: int, time_s: float | None) -> int:
        """The statistics of the recent completions and the completion rate, the same in every
        row, from column ``col``; returns the next column."""
        cfg = self.cfg
        rec = ring_latest(self.total, min(self.size, cfg.recent), cfg.window)
        o, i = self.out[rec], self.inp[rec]
        glob = global_stat_columns(
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
            rate = float(completion_rate(recent, cfg))
        for value in (*(float(g[0]) for g in glob), rate):
            x[:, col] = value
            col += 1
        return col

    def _key_columns(
        self,
        x: np.ndarray,
        col: int,
        queries: dict[str, np.ndarray],
        a: np.ndarray,
        time_s: float | None,
    ) -> int:
        """Six per-key columns per (key source, window) table, then one time-since-last-seen
        column per key source, from column ``col``; returns the next column."""
        cfg = self.cfg
        # rows in key order: neighbouring searches share their path (cache, branches)
        by_key = {src: np.argsort(q, kind="stable") for src, q in queries.items()}
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
        return col + len(cfg.key_sources)

    def _conditional_columns(
        self,
        x: np.ndarray,
        col: int,
        queries: dict[str, np.ndarray],
        bases: dict[str, np.ndarray],
        a: np.ndarray,
    ) -> int:
        """The conditional finish columns over the horizon per window: the marginal's, then
        each key source's, from column ``col``; returns the next column."""
        cfg = self.cfg
        # rows in key and age order: neighbouring searches share their path
        by_key_age = {src: np.argsort(b | a.astype(np.uint64)) for src, b in bases.items()}
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
        return col

    def period_features(
        self,
        prompt_tokens: np.ndarray,
        age: np.ndarray,
        prompt_key: np.ndarray | None,
        ends: np.ndarray,
    ) -> np.ndarray:
        """Period features ``(n, bins, P)`` of the hazard model's bins from the observed
        completions (what :func:`balanceroute.features.causal.periods.trace_period_features`
        builds offline)."""
        cfg = self.cfg
        a = np.asarray(age, dtype=np.int64)
        offsets = bin_offsets(ends)
        cols: list[np.ndarray] = []
        for win in cfg.cond_tables:
            mc = self.marginal[win]
            marginal = (np.full(a.size, float(mc.n)), mc.surv(a[:, None] + offsets[None, :]))
            keyed = []
            for src in cfg.key_sources:
                keys = derive_keys(src, prompt_tokens, prompt_key)
                surv = self.keyed[(src, win)].surv_matrix(keys, a, int(offsets[-1]))
                keyed.append((None, surv[:, offsets]))
            cols += bin_hazard_columns(marginal, keyed, cfg.em_prior)
        return stack_periods(cols)

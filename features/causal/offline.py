"""Causal features of a trace's own snapshots, built offline in one pass (training, evaluation)."""

from __future__ import annotations

import numpy as np

from balanceroute.features.asof import asof_key_terms
from balanceroute.features.causal.columns import (
    completion_rate,
    cond_columns,
    conversation_columns,
    cumsum0,
    ewma_alpha,
    ewma_run,
    global_stat_columns,
    key_stat_columns,
)
from balanceroute.features.causal.config import CausalConfig
from balanceroute.features.keys import derive_keys
from balanceroute.features.schema import TraceArrays


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
            e[1:] = ewma_run(out, ewma_alpha(hl), np.nan)
        cols.append(e[n_done])

    lo_rec = np.maximum(n_done - cfg.recent, 0)
    cs_out, cs_sq, cs_in = cumsum0(out), cumsum0(out * out), cumsum0(inp)
    glob = global_stat_columns(
        n_done - lo_rec,
        cs_out[n_done] - cs_out[lo_rec],
        cs_sq[n_done] - cs_sq[lo_rec],
        cs_in[n_done] - cs_in[lo_rec],
    )
    first_in_rate = np.searchsorted(fin_sorted, time_s - cfg.rate_window_s, side="left")
    rate = completion_rate(n_done - np.maximum(first_in_rate, lo_win), cfg)
    cols += [*glob, rate]

    hist_keys = {
        src: derive_keys(src, history.prompt_tokens, history.prompt_key)[order]
        for src in cfg.key_sources
    }
    q_keys = {src: derive_keys(src, prompt_tokens, prompt_key) for src in cfg.key_sources}
    since, previous = [], {}
    for src in cfg.key_sources:
        wins = [w for s, w in cfg.key_tables if s == src]
        blocks, last = _offlinekey_stat_columns(
            hist_keys[src], out, inp, fin_sorted, q_keys[src], n_done, wins, age
        )
        cols += [c for block in blocks for c in block]
        since.append(time_s - last[0])
        previous[src] = last
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
        cols += cond_columns(marginal, keyed, cfg)
    for src in cfg.conversation_sources:
        _, last_prompt, last_out = previous[src]
        cols += conversation_columns(prompt_tokens, last_prompt, last_out)
    return np.column_stack(cols)


def _offlinekey_stat_columns(
    hist_keys: np.ndarray,
    out: np.ndarray,
    inp: np.ndarray,
    fin: np.ndarray,
    q_keys: np.ndarray,
    n_done: np.ndarray,
    windows: list[int],
    age: np.ndarray,
) -> tuple[list[np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per-key window sums, one block per window, by one composite sort: (key id, rank).

    Also the key's last completion in the first (whole) window: its finish time, prompt and
    output (NaN if none).
    """
    valid = hist_keys != 0
    uniq = np.unique(hist_keys[valid])
    if uniq.size == 0:
        z = np.zeros(q_keys.shape[0], dtype=np.int64)
        none = np.full(q_keys.shape[0], np.nan)
        return [key_stat_columns(z, z, z, z, age) for _ in windows], (none, none, none)
    stride = np.int64(out.shape[0] + 1)
    ranks = np.flatnonzero(valid).astype(np.int64)
    comp = np.searchsorted(uniq, hist_keys[valid]).astype(np.int64) * stride + ranks
    srt = np.argsort(comp, kind="stable")
    comp = comp[srt]
    k_out = out[valid][srt]
    k_fin = fin[valid][srt]
    k_inp = inp[valid][srt]
    cs1, cs2 = cumsum0(k_out), cumsum0(k_out * k_out)

    kid_q = np.minimum(np.searchsorted(uniq, q_keys), uniq.size - 1)
    found = (q_keys != 0) & (uniq[kid_q] == q_keys)
    base = kid_q.astype(np.int64) * stride
    hi = np.searchsorted(comp, base + n_done, side="left")
    at = np.maximum(hi - 1, 0)
    last_all = k_out[at]
    last = (np.full(q_keys.shape[0], np.nan),) * 3
    blocks = []
    for j, w in enumerate(windows):
        lo = np.searchsorted(comp, base + np.maximum(n_done - w, 0), side="left")
        cnt = np.where(found, hi - lo, 0)
        s1 = np.where(found, cs1[hi] - cs1[lo], 0)
        s2 = np.where(found, cs2[hi] - cs2[lo], 0)
        blocks.append(key_stat_columns(cnt, s1, s2, np.where(cnt > 0, last_all, 0), age))
        if j == 0:
            has = cnt > 0
            last = tuple(np.where(has, col[at], np.nan) for col in (k_fin, k_inp, k_out))
    return blocks, last


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

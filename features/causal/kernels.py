"""Compiled column writers for :meth:`balanceroute.features.causal.online.OnlineHistory.features`.

Each kernel answers one group of feature columns for a whole batch of snapshots and writes them
straight into the feature matrix, with the same arithmetic as the numpy definitions in
:mod:`balanceroute.features.causal.columns` (``key_stat_columns`` and ``cond_columns``, whose
blend is :mod:`balanceroute.features.blend`), so online features equal the offline builder's
(``tests/features/test_causal_kernels.py`` holds each kernel to its numpy definition). One compiled call replaces a few dozen small numpy
calls: at router batch sizes (hundreds of rows) their fixed cost was most of the time.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True, nogil=True, inline="always")
def _count_le(arr, v):
    """How many entries of the sorted ``arr`` are ``<= v`` (``searchsorted(side="right")``),
    by a branch-free binary search: the loads of a batch's searches overlap instead of each
    waiting on a mispredicted branch."""
    n = arr.shape[0]
    if n == 0:
        return 0
    base = 0
    while n > 1:
        half = n >> 1
        base = base + half if arr[base + half] <= v else base
        n -= half
    return base + (1 if arr[base] <= v else 0)


@njit(cache=True, nogil=True)
def key_table_columns(
    table_keys, count, s1, s2, last, last_time, queries, order, age, x, col, now, since_col
):
    """KEY_STATS columns ``x[:, col:col+6]`` from one per-key window table (sorted keys).

    Rows whose key is 0 or unseen get count 0 and NaN statistics. With ``since_col >= 0`` also
    writes the seconds from the key's last completion to ``now`` there (NaN without one).
    """
    m = table_keys.shape[0]
    nan = np.nan
    for i in order:  # rows by key: neighbouring searches share their path (cache, branches)
        k = queries[i]
        p = 0
        hit = False
        if m > 0 and k != 0:
            p = _count_le(table_keys, k - np.uint64(1))  # first index with a key >= k
            if p >= m:
                p = m - 1
            hit = table_keys[p] == k
        a = float(age[i])
        if hit and count[p] > 0:
            c = float(count[p])
            mean = s1[p] / c
            var = s2[p] / c - mean * mean
            std = np.sqrt(var) if var > 0.0 else 0.0
            lastf = float(last[p])
            x[i, col] = c
            x[i, col + 1] = mean
            x[i, col + 2] = std
            x[i, col + 3] = lastf
            x[i, col + 4] = mean - a
            x[i, col + 5] = lastf - a
        else:
            x[i, col] = 0.0
            for j in range(1, 6):
                x[i, col + j] = nan
        if since_col >= 0:
            x[i, since_col] = now - last_time[p] if hit else nan


@njit(cache=True, nogil=True, inline="always")
def _marginal_terms(surv, csurv, a, horizon):
    """``S(a)``, ``S(a+H)`` and ``CS(a+H) - CS(a)`` of the marginal's survival counts."""
    top_s = surv.shape[0] - 1
    top_c = csurv.shape[0] - 1
    s_a = surv[min(a, top_s)]
    s_b = surv[min(a + horizon, top_s)]
    return s_a, s_b, csurv[min(a + horizon, top_c)] - csurv[min(a, top_c)]


@njit(cache=True, nogil=True, inline="always")
def _write_cond(x, i, col, s_a, s_b, capped):
    """COND_STATS of one row: outputs above the age, ``P(r <= H)``, ``E[min(r, H)]``."""
    x[i, col] = s_a
    if s_a > 0:
        x[i, col + 1] = 1.0 - s_b / s_a
        x[i, col + 2] = capped / s_a
    else:
        x[i, col + 1] = np.nan
        x[i, col + 2] = np.nan


@njit(cache=True, nogil=True)
def marginal_columns(surv, csurv, age, horizon, x, col):
    """The marginal's COND_STATS ``x[:, col:col+3]`` (NaN where no output is above the age)."""
    for i in range(age.shape[0]):
        s_a, s_b, cm = _marginal_terms(surv, csurv, age[i], horizon)
        _write_cond(x, i, col, s_a, s_b, cm)


@njit(cache=True, nogil=True)
def keyed_columns(
    comp,
    csum,
    base,
    queries,
    order,
    age,
    horizon,
    out_mask,
    surv,
    csurv,
    marginal_n,
    em_prior,
    x,
    col,
):
    """One key source's COND_STATS + EM_STATS ``x[:, col:col+5]`` from its (key, output)
    composite counts: the key's conditional answers, then exactmatch's estimate with the
    marginal's counts as ``em_prior`` pseudo-observations."""
    bw = em_prior / max(marginal_n, 1.0)
    h = np.uint64(horizon)
    for i in order:  # rows by (key, age): neighbouring searches share their path
        a = age[i]
        if queries[i] == 0:
            s_a = 0.0
            s_b = 0.0
            capped = 0.0
        else:
            b = base[i]
            ua = np.uint64(a)
            i_a = _count_le(comp, b | ua)
            i_b = _count_le(comp, b | (ua + h))
            end = _count_le(comp, b | out_mask)
            s_a = float(end - i_a)
            s_b = float(end - i_b)
            within = csum[i_b] - csum[i_a] - a * (i_b - i_a)
            capped = within + horizon * s_b
        _write_cond(x, i, col, s_a, s_b, capped)
        sm_a, sm_b, cm = _marginal_terms(surv, csurv, a, horizon)
        den = s_a + bw * sm_a
        if den > 0:
            x[i, col + 3] = 1.0 - (s_b + bw * sm_b) / den
            x[i, col + 4] = (capped + bw * cm) / den
        else:
            x[i, col + 3] = np.nan
            x[i, col + 4] = np.nan

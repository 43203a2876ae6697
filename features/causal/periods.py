"""Person-period features of the discrete-time hazard model: one row per (snapshot, age bin).

The horizon ``1..H`` ahead of a running request is cut into bins, denser near the present
(:func:`hazard_bins`); bin ``j`` covers remaining lengths ``ends[j-1] < r <= ends[j]``. Besides
the snapshot's causal features, a person-period row carries its bin (first offset and width) and
what the empirical estimators say about that bin at the snapshot's age: the conditional chance
to finish in it given survival to its start, ``1 - S(a + ends[j]) / S(a + ends[j-1])``, from the
window's marginal survival counts and, per key source, from the key's counts blended with the
marginal's (``exactmatch``'s shrinkage), plus how many of the key's outputs are still above the
bin's start. :func:`bin_hazard_columns` is the one numpy definition; offline the counts come
from an as-of sweep (:func:`trace_period_features`), online from the same windowed counts the
stacked features use (:meth:`balanceroute.features.causal.OnlineHistory.period_features`).
"""

from __future__ import annotations

import numpy as np

from balanceroute.features.asof import asof_key_survival
from balanceroute.features.causal.config import CausalConfig
from balanceroute.features.keys import derive_keys
from balanceroute.features.schema import TraceArrays

BIN_FEATURES: tuple[str, ...] = ("bin_start", "bin_width")
_CHUNK = 65_536  # design rows written at a time
Survival = tuple[np.ndarray | None, np.ndarray]  # (window count n, S(a + offset) per offset)


def hazard_bins(horizon: int, n_bins: int) -> np.ndarray:
    """Upper ends of the age bins over ``1..H``: geometric (``H ** (j / n)``), so bins are one
    iteration wide near the present and widen toward ``H``; duplicates merged, last is ``H``."""
    if horizon < 1 or n_bins < 1:
        raise ValueError(f"need horizon >= 1 and n_bins >= 1, got {horizon}, {n_bins}")
    j = np.arange(1, n_bins + 1, dtype=np.float64)
    ends = np.unique(np.round(float(horizon) ** (j / n_bins)).astype(np.int64).clip(1, horizon))
    return np.unique(np.r_[ends, horizon])


def bin_offsets(ends: np.ndarray) -> np.ndarray:
    """Offsets ``0, ends[0], ..., ends[-1]`` at which survival counts are read."""
    return np.r_[0, np.asarray(ends, dtype=np.int64)]


def _hazard(den: np.ndarray, num: np.ndarray) -> np.ndarray:
    """``1 - num / den`` per bin, NaN where ``den = 0`` (nothing known at the bin's start)."""
    ok = den > 0
    return np.where(ok, 1.0 - num / np.where(ok, den, 1.0), np.nan)


def bin_hazard_columns(
    marginal: Survival, keyed: list[Survival], em_prior: float
) -> list[np.ndarray]:
    """Per-bin columns ``(n, bins)`` of one window: the marginal's hazard, then per key source
    the blended hazard and the key's outputs above the bin's start.

    Inputs are survival counts at :func:`bin_offsets` (``(n, bins + 1)``) with the window count
    (the keys' counts are not needed).
    """
    n_m, s_m = marginal
    cols = [_hazard(s_m[:, :-1], s_m[:, 1:])]
    bw = (em_prior / np.maximum(n_m, 1.0))[:, None]
    for _, s_k in keyed:
        blend = s_k + bw * s_m
        cols += [_hazard(blend[:, :-1], blend[:, 1:]), s_k[:, :-1]]
    return cols


def stack_periods(columns: list[np.ndarray]) -> np.ndarray:
    """Per-bin columns stacked into ``(n, bins, P)``."""
    return np.stack(columns, axis=2)


def trace_period_features(
    trace: TraceArrays, index: np.ndarray, age: np.ndarray, cfg: CausalConfig, ends: np.ndarray
) -> np.ndarray:
    """Period features ``(n, bins, P)`` of snapshots of a trace's own requests, as of each
    snapshot's time (the offline twin of ``OnlineHistory.period_features``)."""
    finish = cfg.finish_times(trace)
    order = np.argsort(finish, kind="stable")
    t = cfg.snapshot_times(trace, index, age)
    n_done = np.searchsorted(finish[order], t, side="left")
    out = trace.output_tokens[order]
    offsets = bin_offsets(ends)
    ones = np.ones(out.size, dtype=np.uint64)
    q_ones = np.ones(index.size, dtype=np.uint64)
    cols: list[np.ndarray] = []
    for w in cfg.cond_tables:
        marginal = asof_key_survival(ones, out, q_ones, n_done, age, offsets, w)
        keyed = []
        for src in cfg.key_sources:
            hist = derive_keys(src, trace.prompt_tokens, trace.prompt_key)[order]
            q = derive_keys(src, trace.prompt_tokens[index], trace.prompt_key[index])
            keyed.append(asof_key_survival(hist, out, q, n_done, age, offsets, w))
        cols += bin_hazard_columns(marginal, keyed, cfg.em_prior)
    return stack_periods(cols)


def period_rows(
    periods: np.ndarray, snapshot: np.ndarray, bins: np.ndarray, ends: np.ndarray
) -> np.ndarray:
    """The bin's own columns of each person-period row: its first offset, its width and its
    period features (``(rows, 2 + P)``)."""
    ends = np.asarray(ends, dtype=np.int64)
    starts = bin_offsets(ends)[:-1] + 1
    out = np.empty((snapshot.size, len(BIN_FEATURES) + periods.shape[2]))
    out[:, 0] = starts[bins]
    out[:, 1] = ends[bins] - starts[bins] + 1
    out[:, 2:] = periods[snapshot, bins]
    return out


def period_design(
    x: np.ndarray,
    periods: np.ndarray,
    snapshot: np.ndarray,
    bins: np.ndarray,
    ends: np.ndarray,
    dtype: type = np.float64,
    columns: np.ndarray | None = None,
) -> np.ndarray:
    """Person-period design matrix: the snapshot's features (``columns`` of them, default all)
    followed by :func:`period_rows`, one row per ``(snapshot[i], bins[i])``."""
    if columns is not None:
        x = x[:, columns]
    f = x.shape[1]
    z = np.empty((snapshot.size, f + len(BIN_FEATURES) + periods.shape[2]), dtype=dtype)
    for lo in range(0, snapshot.size, _CHUNK):  # chunks: no full-size float64 temporaries
        s, b = snapshot[lo : lo + _CHUNK], bins[lo : lo + _CHUNK]
        rows = slice(lo, lo + s.size)
        z[rows, :f] = x[s]
        z[rows, f:] = period_rows(periods, s, b, ends)
    return z

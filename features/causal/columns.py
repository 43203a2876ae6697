"""The numpy definitions of the causal feature columns, shared by the offline builder and the online
state (whose compiled writers in :mod:`balanceroute.features.causal.kernels` follow them)."""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.features.blend import Terms, blend_terms, conditional_answers
from balanceroute.features.causal.config import CausalConfig


def ewma_alpha(halflife: int) -> float:
    """EWMA weight of the newest value for a half-life counted in completions."""
    return 1.0 - 0.5 ** (1.0 / max(int(halflife), 1))


def ewma_run(x: np.ndarray, alpha: float, state: float) -> np.ndarray:
    """EWMA after each element of ``x``, starting from ``state`` (NaN = no history yet)."""
    x = x.astype(np.float64)
    if np.isnan(state):
        state = float(x[0])
    return ewma_kernel(x, alpha, state)


@njit(cache=True, nogil=True)
def ewma_kernel(x: np.ndarray, alpha: float, state: float) -> np.ndarray:
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


def key_stat_columns(
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


def global_stat_columns(
    cnt: np.ndarray, out_sum: np.ndarray, out_sq: np.ndarray, in_sum: np.ndarray
) -> list[np.ndarray]:
    """Rolling output mean/std and input mean (GLOBAL_FEATURES order; the rate comes apart)."""
    c = cnt.astype(np.float64)
    has = c > 0
    safe = np.where(has, c, 1.0)
    mean = np.where(has, out_sum / safe, np.nan)
    var = np.where(has, out_sq / safe - (out_sum / safe) ** 2, np.nan)
    return [mean, np.sqrt(np.clip(var, 0.0, None)), np.where(has, in_sum / safe, np.nan)]


def completion_rate(n_in_window: np.ndarray, cfg: CausalConfig) -> np.ndarray:
    """Completions per second over the rate window."""
    return n_in_window.astype(np.float64) / cfg.rate_window_s


def conversation_columns(
    prompt_tokens: np.ndarray, last_prompt: np.ndarray, last_output: np.ndarray
) -> list[np.ndarray]:
    """CONVERSATION_STATS from the key's last finished request (NaN without one): its prompt,
    how much the context grew since (its output and the new message, in a conversation), and
    that growth less its output (the new message's length)."""
    growth = prompt_tokens.astype(np.float64) - last_prompt
    return [last_prompt, growth, growth - last_output]


def _cond(terms: Terms) -> list[np.ndarray]:
    """COND_STATS of one set of survival terms: outputs above the age, ``P(r <= H)``,
    ``E[min(r, H)]`` (NaN without evidence)."""
    _, _, p, c = conditional_answers(*terms, unknown_p=np.nan, unknown_c=np.nan)
    return [terms[0], p, c]


def cond_columns(
    marginal: tuple[np.ndarray, ...], keyed: list[tuple[np.ndarray, ...]], cfg: CausalConfig
) -> list[np.ndarray]:
    """COND_STATS of the marginal, then COND_STATS + EM_STATS per key source.

    Every input is ``(n, S(a), S(a+H), sum_{o>a} min(o-a, H))`` over the window, from
    :meth:`KeyedCounts.query` (online) or :func:`asof_key_terms` (offline). EM_STATS are
    ``exactmatch``'s answers: the key's counts blended with the marginal's as ``em_prior``
    pseudo-observations (:mod:`balanceroute.features.blend`).
    """
    nm, *rest = marginal
    m_terms = (rest[0], rest[1], rest[2])
    cols = _cond(m_terms)
    bw = cfg.em_prior / np.maximum(nm, 1.0)
    for _, s_a, s_b, capped in keyed:
        k_terms = (s_a, s_b, capped)
        cols += _cond(k_terms)
        blended = blend_terms(m_terms, k_terms, bw, 1.0)
        _, _, p, c = conditional_answers(*blended, unknown_p=np.nan, unknown_c=np.nan)
        cols += [p, c]
    return cols


def cumsum0(x: np.ndarray) -> np.ndarray:
    """Cumulative sums with a leading 0 (int64): ``out[j] = sum(x[:j])``."""
    out = np.zeros(x.shape[0] + 1, dtype=np.int64)
    np.cumsum(x, out=out[1:])
    return out

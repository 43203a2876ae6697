"""BalanceRoute scores (DESIGN 5.2, 5.3) and the exact subset search within a candidate window.

``F0_g(Q) = b(Q) - G * max(0, b(Q) - m_g)``: filling worker ``g``'s margin below the current
maximum is rewarded one for one; overflowing it costs ``G - 1`` per token (the change of
imbalance). ``F_g^H(Q) = Gamma * b(Q) - beta * sum_h gamma^h * max(0, b(Q) - m_{g,h})`` with
``Gamma = sum_h gamma^h`` scores against projected margins; at ``H = 0, beta = G`` it is ``F0``.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def discount_weights(horizon: int, gamma: float) -> np.ndarray:
    """``gamma^h`` for ``h = 0..H``."""
    return np.power(float(gamma), np.arange(horizon + 1, dtype=np.float64))


def br0_score(b: np.ndarray, margin: float, workers: int) -> np.ndarray:
    """``F0``: negative change of imbalance from adding load ``b`` to a worker with ``margin``."""
    b = np.asarray(b, dtype=np.float64)
    return b - workers * np.maximum(0.0, b - margin)


def horizon_score(
    b: np.ndarray,
    margins: np.ndarray,
    weights: np.ndarray,
    beta: float,
    penalty: str = "sum",
) -> np.ndarray:
    """``F^H`` of loads ``b`` (shape ``(n,)``) against one worker's margins ``(H+1,)``.

    ``penalty="max"`` replaces the discounted sum of overflows by ``Gamma`` times the largest
    overflow over the horizon (a variant measured in the studies).
    """
    b = np.asarray(b, dtype=np.float64)
    over = b[:, None] - margins[None, :]
    np.maximum(over, 0.0, out=over)
    total = weights.sum()
    pen = over @ weights if penalty == "sum" else over.max(axis=1) * total
    return total * b - beta * pen


def horizon_score_all(
    b: float, margins: np.ndarray, weights: np.ndarray, beta: float, penalty: str = "sum"
) -> np.ndarray:
    """``F^H`` of one load ``b`` for every worker (margins ``(G, H+1)``)."""
    over = np.maximum(b - margins, 0.0)
    total = weights.sum()
    pen = over @ weights if penalty == "sum" else over.max(axis=1) * total
    return total * b - beta * pen


@lru_cache(maxsize=32)
def subset_table(r: int) -> tuple[np.ndarray, np.ndarray]:
    """All non-empty subsets of ``r`` candidates: a ``(2^r - 1, r)`` 0/1 matrix and the sizes."""
    codes = np.arange(1, 2**r, dtype=np.int64)
    masks = ((codes[:, None] >> np.arange(r)[None, :]) & 1).astype(np.float64)
    masks.setflags(write=False)
    sizes = masks.sum(axis=1).astype(np.int64)
    sizes.setflags(write=False)
    return masks, sizes


def best_subset(
    prompts: np.ndarray,
    margins: np.ndarray,
    weights: np.ndarray,
    beta: float,
    max_size: int,
    penalty: str = "sum",
    capacity_slack: np.ndarray | None = None,
) -> tuple[np.ndarray, float]:
    """The subset of at most ``max_size`` candidates with the best score, by enumeration.

    Returns the chosen candidate indices (in window order) and their score; ties go to the
    subset listed first (lowest bit pattern, i.e. favouring the oldest candidates). With
    ``capacity_slack`` (per subset size ``q``, the largest total prompt that keeps the worker
    under its KV capacity over the horizon) infeasible subsets are excluded; an empty result
    means nothing fits.
    """
    r = int(prompts.shape[0])
    masks, sizes = subset_table(r)
    ok = sizes <= max_size
    b = masks @ prompts.astype(np.float64)
    if capacity_slack is not None:
        ok &= b <= capacity_slack[np.minimum(sizes, capacity_slack.shape[0] - 1)]
    if not ok.any():
        return np.zeros(0, dtype=np.int64), -np.inf
    scores = horizon_score(b, margins, weights, beta, penalty)
    scores[~ok] = -np.inf
    best = int(np.argmax(scores))
    return np.flatnonzero(masks[best]).astype(np.int64), float(scores[best])


@lru_cache(maxsize=32)
def subset_members(r: int) -> tuple[tuple[int, ...], ...]:
    """The non-empty subsets of ``range(r)`` as index tuples, in bit-pattern order."""
    return tuple(
        tuple(i for i in range(r) if code >> i & 1) for code in range(1, 2**r)
    )

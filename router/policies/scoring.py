"""BalanceRoute scores (docs/design.md, "BR-0 and BR-H") and the exact subset search within a candidate window.

``F0_g(Q) = b(Q) - G * max(0, b(Q) - m_g)``: filling worker ``g``'s margin below the current
maximum is rewarded one for one; overflowing it costs ``G - 1`` per token (the change of
imbalance). ``F_g^H(Q) = Gamma * b(Q) - beta * sum_h gamma^h * max(0, b(Q) - m_{g,h})`` with
``Gamma = sum_h gamma^h`` scores against projected margins; at ``H = 0, beta = G`` it is ``F0``.
"""

from __future__ import annotations

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


class OutputMean:
    """Exponentially weighted mean of finished requests' output lengths (about 1,000 of them)."""

    def __init__(self, weight: float = 1e-3) -> None:
        self.weight = weight
        self.mean = 0.0
        self.seen = 0

    def update(self, outputs: np.ndarray) -> float:
        for x in np.asarray(outputs, dtype=np.float64).tolist():
            self.seen += 1
            w = max(self.weight, 1.0 / self.seen)
            self.mean += w * (x - self.mean)
        return self.mean

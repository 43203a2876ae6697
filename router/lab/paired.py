"""Paired ratios over many windows: geometric mean, 95% t-interval on log ratios, a verdict.

Every arm replays the same windows with the same releases, so the comparison of an arm with
the reference is a set of per-window ratios ``a_i / b_i``. Their logarithms are summed effects
of many routing decisions (close to normal, symmetric where the ratios are skewed), so the
paired ratio is ``exp(mean log)`` (the geometric mean) with a Student-t interval on the log
scale. A t-interval rather than a percentile bootstrap: with 30 windows the bootstrap's
interval is too narrow (it ignores the t tails and shrinks by ``sqrt((n-1)/n)``), and the
t-interval is deterministic (no resampling seed). Overlapping windows are not independent: when
``N`` windows of ``M`` requests cover ``n`` requests ``f = N M / n > 1`` times over, the
standard error is inflated by ``sqrt(f)`` (the variance of means of overlapping blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy import stats

LEVEL = 0.95
BETTER, WORSE, SAME = "better", "worse", "no difference detected"
HIGHER_IS_BETTER = frozenset({"throughput_tok_s"})


@dataclass(frozen=True)
class PairedRatio:
    """Geometric-mean ratio of an arm to the reference over paired windows, with its interval."""

    ratio: float
    low: float
    high: float
    windows: int
    verdict: str

    def as_dict(self) -> dict[str, float | int | str]:
        return {
            "ratio": self.ratio,
            "low": self.low,
            "high": self.high,
            "windows": self.windows,
            "verdict": self.verdict,
        }


def verdict(low: float, high: float, higher_is_better: bool = False) -> str:
    """Better, worse, or no difference detected, from the interval of the ratio."""
    if high < 1.0:
        return WORSE if higher_is_better else BETTER
    if low > 1.0:
        return BETTER if higher_is_better else WORSE
    return SAME


def t_interval(
    values: np.ndarray, *, overlap: float = 1.0, level: float = LEVEL
) -> tuple[float, float, int]:
    """Mean of paired values, the half-width of its Student-t interval and their count: the one
    paired interval of the A/B, the twin's comparison, the prior and the switchback (half-width
    ``nan`` below two values; ``overlap`` widens the standard error by ``sqrt(overlap)``)."""
    x = np.asarray(values, dtype=np.float64)
    n = int(x.size)
    if n == 0:
        return math.nan, math.nan, 0
    m = float(x.mean())
    if n < 2:
        return m, math.nan, n
    se = float(x.std(ddof=1)) / math.sqrt(n) * math.sqrt(max(1.0, overlap))
    return m, float(stats.t.ppf(0.5 + level / 2, n - 1)) * se, n


def paired_ratio(
    values: np.ndarray,
    reference: np.ndarray,
    *,
    overlap: float = 1.0,
    level: float = LEVEL,
    higher_is_better: bool = False,
) -> PairedRatio | None:
    """The paired ratio of ``values`` to ``reference`` (window by window); ``None`` without
    two positive pairs. ``overlap`` is how many times over the windows cover the requests."""
    a = np.asarray(values, dtype=np.float64)
    b = np.asarray(reference, dtype=np.float64)
    ok = np.isfinite(a) & np.isfinite(b) & (a > 0) & (b > 0)
    m, half, n = t_interval(np.log(a[ok] / b[ok]), overlap=overlap, level=level)
    if n < 2:
        return None
    low, high = math.exp(m - half), math.exp(m + half)
    return PairedRatio(math.exp(m), low, high, n, verdict(low, high, higher_is_better))


def ratio_interval(logs: np.ndarray, level: float = LEVEL) -> dict[str, Any]:
    """Geometric-mean ratio of paired log ratios and its Student-t interval, as a plain dict
    (``blocks`` counted; no bounds below two)."""
    m, half, n = t_interval(logs, level=level)
    if n == 0:
        return {"blocks": 0, "ratio": None, "low": None, "high": None}
    if n < 2:
        return {"blocks": n, "ratio": math.exp(m), "low": None, "high": None}
    return {
        "blocks": n,
        "ratio": math.exp(m),
        "low": math.exp(m - half),
        "high": math.exp(m + half),
    }

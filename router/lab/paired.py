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
    logs = np.log(a[ok] / b[ok])
    n = int(logs.size)
    if n < 2:
        return None
    m = float(logs.mean())
    se = float(logs.std(ddof=1)) / math.sqrt(n) * math.sqrt(max(1.0, overlap))
    t = float(stats.t.ppf(0.5 + level / 2, n - 1))
    low, high = math.exp(m - t * se), math.exp(m + t * se)
    return PairedRatio(math.exp(m), low, high, n, verdict(low, high, higher_is_better))


def log_ratio_moments(logs: np.ndarray) -> tuple[float, float, int]:
    """Mean, standard error and count of paired log ratios (the twin's sequential test)."""
    x = np.asarray(logs, dtype=np.float64)
    x = x[np.isfinite(x)]
    n = int(x.size)
    if n == 0:
        return 0.0, math.inf, 0
    if n == 1:
        return float(x[0]), math.inf, 1
    return float(x.mean()), float(x.std(ddof=1)) / math.sqrt(n), n

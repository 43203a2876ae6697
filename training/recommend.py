"""Which estimator to deploy behind BR-H, or ``none``: the best by the score that ranks
estimators the way the A/B replays do (``benchmarks/studies/score_ranking.py`` measures which
score that is; docs/results.md, "Completion predictors").

The prediction-free reference ``none`` is scored like every estimator, so it can win: an
estimator is recommended only if it beats ``none`` on that score by more than ``margin``.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

REFERENCE = "none"
# Direction of every score a recommendation may rest on: +1 lower is better, -1 higher is better.
SCORE_SIGNS: dict[str, int] = {
    "brier": 1,
    "log_loss": 1,
    "ece": 1,
    "c_mae": 1,
    "auc": -1,
    "ibs_discounted": 1,
    "ibs_discounted_per_request": 1,
    "brier_at_8": 1,
    "brier_at_16": 1,
    "brier_at_40": 1,
    "brier_at_80": 1,
    "auc_at_8": -1,
    "auc_at_16": -1,
    "auc_at_40": -1,
    "auc_at_80": -1,
    "proj_error": 1,
    "proj_error_margin": 1,
    "replay_ratio": 1,
    "twin_ratio": 1,
}
# The twin's ratio first: what the default BR-H (the twin choosing the blend weight) makes of
# each estimator on the holdout, 1 where the twin keeps no prediction (issue 19). Then, as
# docs/results.md ("Completion predictors") found, the replay ratio; it
# needs a steady state in the replays, and where there is none the projection error decides
RANKING_SCORES: tuple[str, ...] = ("twin_ratio", "replay_ratio", "proj_error_margin")
RANKING_SCORE = RANKING_SCORES[0]
MARGIN = 0.0  # relative improvement over ``none`` an estimator needs to be recommended


@dataclass(frozen=True, slots=True)
class Recommendation:
    """The estimator to deploy (or ``none``), the score it was chosen by and every candidate's."""

    pick: str
    score: str
    scores: dict[str, float]
    margin: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def line(self) -> str:
        """One line for the command's output."""
        shown = ", ".join(f"{k} {v:.4f}" for k, v in sorted(self.scores.items(), key=_by(self)))
        return f"recommendation: {self.pick} (by {self.score}: {shown})"


def _by(rec: Recommendation):
    sign = SCORE_SIGNS[rec.score]
    return lambda item: sign * item[1]


def recommend(
    metrics: dict[str, dict[str, Any]],
    score: str | None = None,
    margin: float = MARGIN,
    deployable: set[str] | None = None,
) -> Recommendation:
    """The best of ``metrics`` (which must hold ``none``) by ``score`` (default: the first of
    :data:`RANKING_SCORES` measured for ``none`` and some estimator); ``none`` unless the best
    estimator improves on it by more than ``margin`` (relative), or when the score could not be
    measured for ``none`` (NaN). Only ``deployable`` kinds (default: every kind given) are
    candidates; an estimator whose score is NaN is not."""
    if score is None:
        for name in RANKING_SCORES:
            rec = recommend(metrics, name, margin, deployable)
            if REFERENCE in rec.scores and len(rec.scores) > 1:
                return rec
        return rec
    if score not in SCORE_SIGNS:
        raise ValueError(f"unknown score '{score}'; known: {', '.join(SCORE_SIGNS)}")
    sign = SCORE_SIGNS[score]
    values = {
        k: float(m[score])
        for k, m in metrics.items()
        if score in m and (deployable is None or k in deployable or k == REFERENCE)
    }
    values = {k: v for k, v in values.items() if math.isfinite(v)}
    if REFERENCE not in values:
        return Recommendation(REFERENCE, score, values, margin)
    base = values[REFERENCE]
    best = min(values, key=lambda k: sign * values[k])
    gain = sign * (base - values[best]) / max(abs(base), 1e-12)
    pick = best if best != REFERENCE and gain > margin else REFERENCE
    return Recommendation(pick, score, values, margin)

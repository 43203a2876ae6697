"""Decision-aware accuracy: how well survival curves serve BR-H's discounted projection.

BR-H scores admissions against loads projected ``h = 1..H`` iterations ahead, weighted by
``gamma^h``; a curve's errors far ahead matter little when ``gamma`` is small. So besides the
Brier score of ``p_finish = P(r <= H)``:

- ``ibs_discounted``: the integrated Brier score of the curve over ``k = 1..H``, weighted by
  ``gamma^k`` (normalised to a weighted mean), ``gamma`` set as BR-H's ``auto_gamma`` rule sets
  it for the trace and the group's ``B`` (:func:`router_gamma`); ``ibs_discounted_per_request`` is the same with every
  snapshot weighted alike (see below);
- ``brier_at_k`` and ``auc_at_k`` (time-dependent: the event ``r <= k`` scored by
  ``1 - P(r > k)``) for ``k`` in :data:`SCORE_KS`.

All of them weigh the holdout's snapshots by *time at risk*, as the router meets requests: a
running request is in the tier for as many iterations as it generates tokens, so a snapshot
(drawn at a uniform age of its request) counts with its request's output length. The
per-request scores (``brier``, ``auc``, ... of :mod:`balanceroute.training.metrics`) give every
request the same weight whatever its length, which over-represents short requests among young
ones: an estimator trained the same way looks sharper there than in a running tier
(docs/design.md, "What an estimator is judged on").
"""

from __future__ import annotations

import numpy as np

from balanceroute.router.policies.balance_config import BRH_DEFAULTS, GAMMA_MAX, GAMMA_MIN
from balanceroute.router.policies.scoring import discount_weights
from balanceroute.training.metrics import auc

SCORE_KS: tuple[int, ...] = (8, 16, 40, 80)
DEFAULT_SLOTS = 32  # the group evaluate scores for unless told (B of the replay scores)


def router_gamma(
    output_tokens: np.ndarray, slots: int = DEFAULT_SLOTS, auto_gamma: float | None = None
) -> float:
    """The discount BR-H's ``auto_gamma`` rule sets for outputs like these on workers of
    ``slots`` slots: ``clip(1 - auto_gamma * B / mean output, GAMMA_MIN, GAMMA_MAX)``
    (docs/design.md, "Short outputs")."""
    x = BRH_DEFAULTS.auto_gamma if auto_gamma is None else auto_gamma
    mean = float(np.mean(output_tokens))
    return float(np.clip(1.0 - x * slots / mean, GAMMA_MIN, GAMMA_MAX))


def lookahead_weights(horizon: int, gamma: float) -> np.ndarray:
    """BR-H's discounts ``gamma^k`` for the steps ahead ``k = 1..H`` (not ``k = 0``),
    normalised to sum to one: the weight of each step ahead in the decision-aware scores."""
    w = discount_weights(horizon, gamma)[1:]
    return w / w.sum()


def curve_scores(
    survival: np.ndarray,
    remaining: np.ndarray,
    gamma: float,
    horizon: int,
    weight: np.ndarray | None = None,
) -> dict[str, float]:
    """``ibs_discounted`` and ``brier_at_k`` / ``auc_at_k`` of survival curves ``(n, >=H+1)``
    against true remaining lengths ``r`` (a request alive at ``k`` has ``r > k``), each
    snapshot weighted by ``weight`` (its time at risk; default equal)."""
    ks = np.arange(1, horizon + 1)
    w = np.ones(remaining.shape[0]) if weight is None else np.asarray(weight, dtype=np.float64)
    w = w / w.sum()
    alive = (remaining[:, None] > ks[None, :]).astype(np.float64)
    sq = (survival[:, 1 : horizon + 1] - alive) ** 2
    brier = w @ sq
    discount = lookahead_weights(horizon, gamma)
    out = {
        "ibs_discounted": float(brier @ discount),
        "ibs_discounted_per_request": float(sq.mean(axis=0) @ discount),
        "gamma": gamma,
    }
    for k in SCORE_KS:
        if k <= horizon:
            out[f"brier_at_{k}"] = float(brier[k - 1])
            out[f"auc_at_{k}"] = auc(1.0 - survival[:, k], 1.0 - alive[:, k - 1], w)
    return out

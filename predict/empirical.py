"""The empirical estimators' answer: a prediction from the survival counts of a sliding window.

``survival`` asks it with the marginal alone, ``exactmatch`` with its key's counts blended in
(:mod:`balanceroute.features.blend` has the maths and the rule when nothing is known about a
request: it is projected to survive the window, ``p_finish = 0``, ``c = H``, survival all ones,
the same answer as the ``none`` estimator).
"""

from __future__ import annotations

import numpy as np

from balanceroute.features.blend import (
    Terms,
    blend_terms,
    conditional_answers,
    conditional_curves,
)
from balanceroute.features.windows import MarginalCounts
from balanceroute.predict.base import Prediction


def marginal_terms(marginal: MarginalCounts, ages: np.ndarray, horizon: int) -> Terms:
    """``(S(a), S(a+H), sum_{o>a} min(o-a, H))`` of the window's outputs for each age."""
    return (
        marginal.surv(ages),
        marginal.surv(ages + horizon),
        marginal.csurv(ages + horizon) - marginal.csurv(ages),
    )


def conditional_prediction(
    marginal: MarginalCounts,
    ages: np.ndarray,
    horizon: int,
    *,
    key_weight: np.ndarray | float = 0.0,
    marg_weight: np.ndarray | float = 1.0,
    key_terms: Terms | None = None,
    key_surv: np.ndarray | None = None,
    survival: bool = False,
) -> Prediction:
    """``p_finish``, ``c`` (and survival curves) from weighted key and marginal survival counts.

    ``key_terms`` is ``(S_key(a), S_key(a+H), sum_{o>a} min(o-a, H))`` from
    :meth:`KeyedCounts.query`; ``key_surv`` the matching ``(n, H+1)`` matrix when curves are
    wanted. Marginal counts are divided by the window size so ``marg_weight`` is a pseudo-count.
    """
    ages = ages.astype(np.int64)
    h = int(horizon)
    bw = np.asarray(marg_weight, dtype=np.float64) / max(marginal.n, 1)
    aw = np.asarray(key_weight, dtype=np.float64)
    den, num_b, num_c = blend_terms(marginal_terms(marginal, ages, h), key_terms, bw, aw)
    alive, safe, p, c = conditional_answers(den, num_b, num_c, unknown_p=0.0, unknown_c=float(h))
    curves = None
    if survival:
        surv_table, _ = marginal.curves()
        curves = conditional_curves(
            surv_table,
            np.ascontiguousarray(ages),
            h,
            np.ascontiguousarray(np.broadcast_to(bw, ages.shape), dtype=np.float64),
            np.ascontiguousarray(np.broadcast_to(aw, ages.shape), dtype=np.float64),
            np.zeros((0, 0)) if key_surv is None else np.ascontiguousarray(key_surv),
            np.ascontiguousarray(alive),
            np.ascontiguousarray(safe),
        )
        p = 1.0 - curves[:, h]
        c = curves[:, :h].sum(axis=1) if h > 0 else np.zeros(ages.size)
    return Prediction(p_finish=np.clip(p, 0.0, 1.0), c=np.clip(c, min(1.0, h), h), survival=curves)

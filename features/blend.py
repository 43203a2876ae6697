"""The key/marginal blend of survival counts, and the conditional answers drawn from it.

For a request alive at age ``a`` (its output ``O > a``) with remaining ``r = O - a``, weights
``bw`` on the marginal's survival counts ``S_m`` and ``aw`` on its key's ``S_k``:

- ``den = bw * S_m(a) + aw * S_k(a)``, the weighted outputs still above the age;
- ``P(r > h) = (bw * S_m(a+h) + aw * S_k(a+h)) / den``, so ``p_finish = 1 - P(r > H)``;
- ``c = E[min(r, H)] = (bw * C_m + aw * C_k) / den`` with ``C = sum_{o>a} min(o - a, H)``.

``aw = 0, bw = 1`` is the marginal (``survival``); ``aw = 1, bw = prior / n`` is the
Dirichlet-process posterior that shrinks a key's CDF toward the marginal by its count
(``exactmatch`` and the stacked features of ``gbdt``). Where ``den = 0`` nothing is known about
the request: the caller says what to answer (the estimators project it to survive the window,
the feature builder writes NaN). :func:`blend_terms` and :func:`conditional_answers` are the one
numpy definition; :func:`conditional_curves` is its compiled twin for whole curves.
"""

from __future__ import annotations

import numpy as np
from numba import njit

Terms = tuple[np.ndarray, np.ndarray, np.ndarray]


def blend_terms(
    marginal: Terms,
    key: Terms | None = None,
    marg_weight: np.ndarray | float = 1.0,
    key_weight: np.ndarray | float = 0.0,
) -> Terms:
    """``(den, num_b, num_c)``: the weighted sums of ``(S(a), S(a+H), C)`` of the marginal and,
    if given, the key."""
    sm_a, sm_b, cm = marginal
    den = marg_weight * sm_a
    num_b = marg_weight * sm_b
    num_c = marg_weight * cm
    if key is not None:
        sk_a, sk_b, ck = key
        den = den + key_weight * sk_a
        num_b = num_b + key_weight * sk_b
        num_c = num_c + key_weight * ck
    return den, num_b, num_c


def conditional_answers(
    den: np.ndarray,
    num_b: np.ndarray,
    num_c: np.ndarray,
    *,
    unknown_p: float,
    unknown_c: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(alive, safe, p_finish, c)`` from blended terms; rows with ``den = 0`` are not
    ``alive`` and answer ``unknown_p`` and ``unknown_c``; ``safe`` is ``den`` with those at 1."""
    alive = den > 0
    safe = np.where(alive, den, 1.0)
    p = np.where(alive, 1.0 - num_b / safe, unknown_p)
    c = np.where(alive, num_c / safe, unknown_c)
    return alive, safe, p, c


@njit(cache=True, nogil=True, inline="always")
def mixed_count(surv, key_surv, i, x, h, bw, aw):
    """``bw * S_m(x) + aw * S_k[i, h]`` (the key's term only when ``key_surv`` has rows)."""
    num = bw * surv[min(x, surv.shape[0] - 1)]
    if key_surv.shape[0] > 0:
        num = num + aw * key_surv[i, h]
    return num


@njit(cache=True, nogil=True, inline="always")
def clip01(v):
    """``v`` clipped to ``[0, 1]``."""
    return 0.0 if v < 0.0 else (1.0 if v > 1.0 else v)


@njit(cache=True, nogil=True)
def conditional_curves(surv, ages, horizon, bw, aw, key_surv, alive, safe):
    """``P(r > h)``, h = 0..H: ``(bw * S_m(a+h) + aw * S_k(a+h)) / safe`` clipped to [0, 1],
    1 where nothing is known (``alive`` false) and at h = 0; no (n, H+1) temporaries."""
    n = ages.shape[0]
    out = np.ones((n, horizon + 1))
    for i in range(n):
        if alive[i]:
            for h in range(1, horizon + 1):
                num = mixed_count(surv, key_surv, i, ages[i] + h, h, bw[i], aw[i])
                out[i, h] = clip01(num / safe[i])
    return out

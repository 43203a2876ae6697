"""The one sanity check of predictions, and the health check built on it.

:func:`prediction_problem` says why a prediction is unusable (shapes, non-finite or out-of-range
values); the router's client of the service (:mod:`.remote`) runs it on every answer. A model's
health check (:func:`health_problem`) runs it on a fixed canary batch, spanning the accepted
input sizes, answered within :data:`CANARY_BUDGET_S`: the service (``serve``) and the gateway
run it before they install a model (:mod:`balanceroute.serving.lifecycle`).
"""

from __future__ import annotations

import time

import numpy as np

from balanceroute.features.limits import input_limits
from balanceroute.predict.base import CompletionEstimator, Prediction, RunningBatch

CANARY_BUDGET_S = 1.0


def canary_batch() -> RunningBatch:
    """Running requests spanning the accepted sizes, for the health check."""
    lim = input_limits()
    ages = np.minimum([0, 1, 100, 10_000, lim.max_output_tokens], lim.max_output_tokens)
    prompts = np.minimum([1, 100, 4_000, 100_000, lim.max_prompt_tokens], lim.max_prompt_tokens)
    return RunningBatch(
        prompt_tokens=prompts.astype(np.int64),
        age=ages.astype(np.int64),
        prompt_key=np.array([0, 1, 2, 3, 0], dtype=np.uint64),
    )


def health_problem(estimator: CompletionEstimator) -> str | None:
    """Why ``estimator`` fails its health check (None: it passes)."""
    start = time.perf_counter()
    try:
        pred = estimator.predict(canary_batch(), survival=bool(estimator.provides_survival))
    except Exception as exc:
        return f"the canary prediction raised {type(exc).__name__}: {exc}"
    took = time.perf_counter() - start
    problem = prediction_problem(pred, canary_batch().size, estimator.horizon)
    if problem is not None:
        return f"the canary prediction {problem}"
    if took > CANARY_BUDGET_S:
        return f"the canary prediction took {took:.1f} s (budget {CANARY_BUDGET_S:.1f} s)"
    return None


def prediction_problem(pred: Prediction, n: int, horizon: int) -> str | None:
    """Why ``pred`` is no usable answer for ``n`` requests at ``horizon`` (None: it is)."""
    h = horizon
    surv = pred.survival
    shapes = pred.p_finish.shape == (n,) and pred.c.shape == (n,)
    if not shapes or (surv is not None and surv.shape != (n, h + 1)):
        return "has the wrong shapes"
    values = [pred.p_finish, pred.c] + ([] if surv is None else [surv])
    if not all(np.isfinite(v).all() for v in values):
        return "has non-finite values"
    if (
        (pred.p_finish < 0).any()
        or (pred.p_finish > 1).any()
        or (pred.c < 0).any()
        or (pred.c > h).any()
    ):
        return "is out of range"
    return None

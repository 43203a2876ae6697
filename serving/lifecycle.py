"""What every process that serves a model checks before it uses one: the health check.

A model answers a fixed canary batch, spanning the accepted input sizes, with finite, in-range
values within :data:`CANARY_BUDGET_S`. The service (``serve``) and the gateway both run it
before they install a model.
"""

from __future__ import annotations

import time

import numpy as np

from balanceroute.features.limits import input_limits
from balanceroute.predict.base import CompletionEstimator, RunningBatch

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
    h = estimator.horizon
    values = [pred.p_finish, pred.c] + ([] if pred.survival is None else [pred.survival])
    if not all(np.isfinite(v).all() for v in values):
        return "the canary prediction has non-finite values"
    if (
        (pred.p_finish < 0).any()
        or (pred.p_finish > 1).any()
        or (pred.c < 0).any()
        or (pred.c > h).any()
    ):
        return "the canary prediction is out of range"
    if took > CANARY_BUDGET_S:
        return f"the canary prediction took {took:.1f} s (budget {CANARY_BUDGET_S:.1f} s)"
    return None

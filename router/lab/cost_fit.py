"""Fit the cost model to an engine's step telemetry: ``t_fixed``, ``t_token`` and ``t_prefill``.

Input: the table ``serving.testbed.realgroup.steplog.read_steps`` returns, one row per (group
step, rank). The target is the group step's duration, the time between consecutive group step
ends (the last rank's end), not a pass's own start-to-end: a group step costs the group
everything from one barrier to the next, the scheduling, sampling and output handling between
passes included, and that interval is what the emulator's and the simulator's step stands for.
The first fit regresses on the largest KV tokens and the largest prompt tokens of any rank in
the step (``max_g L_g``, ``max_g P_g``), non-negative least squares. The model's step is
``max_g (t_token L_g + t_prefill P_g)``, not the sum of the two maxima (they differ when one
rank prefills and another holds the most KV), so the fit is refined: regress on the ``L_g``
and ``P_g`` of the rank the current coefficients make the slowest, until that rank stops
changing, keeping whichever coefficients fit the model's own formula best.

Steps left out: the first (no previous end; the engine warms up), those where no rank ran a
real pass (the group idling in dummy passes after its work), and those after an idle spell
(the gap before the step's first pass is longer than the step's own passes: the engine waited
for a request, not for the group). ``t_comm`` is not separated: it is inside ``t_fixed``.

Fit quality is the model's own step formula, ``t_fixed + max_g (t_token L_g + t_prefill P_g)``,
on the steps used: R^2, the median absolute relative error and the number of steps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from balanceroute.features.errors import UserError
from balanceroute.router.lab.cost import DEFAULT_PREFILL_CHUNK, CostModel

MIN_STEPS = 3  # three coefficients
REFINE_ROUNDS = 20


@dataclass(frozen=True, slots=True)
class GroupSteps:
    """The steps a fit uses: durations and per-rank KV and prompt tokens, and what was left out."""

    duration_s: np.ndarray  # (K,)
    kv_tokens: np.ndarray  # (K, G)
    prefill_tokens: np.ndarray  # (K, G)
    left_out: dict[str, int]


@dataclass(frozen=True, slots=True)
class CostFit:
    """A fitted cost model and how well it fits the steps it came from."""

    cost: CostModel
    steps: int
    prefill_steps: int
    r2: float
    median_abs_rel_error: float
    left_out: dict[str, int]
    max_prefill_tokens: int
    source: str

    def as_dict(self) -> dict[str, Any]:
        """The ``fit`` block of a cost file."""
        return {
            "steps": self.steps,
            "prefill_steps": self.prefill_steps,
            "r2": self.r2,
            "median_abs_rel_error": self.median_abs_rel_error,
            "left_out": dict(self.left_out),
            "max_prefill_tokens": self.max_prefill_tokens,
            "source": self.source,
            "target": "time between consecutive group step ends, real steps only",
        }


def group_steps(steps: pd.DataFrame) -> GroupSteps:
    """The group steps a fit may use, from :func:`read_steps` rows (one per step and rank)."""
    needed = {"step", "rank", "kind", "start_s", "end_s", "kv_tokens", "prefill_tokens",
              "duration_s"}  # fmt: skip
    missing = needed - set(steps.columns)
    if missing:
        raise UserError(f"step table lacks columns {sorted(missing)} (use read_steps)")
    by_step = steps.groupby("step")
    start = by_step["start_s"].min()
    end = by_step["end_s"].max()
    real = by_step["kind"].agg(lambda k: bool((k == "real").any()))
    gap = start - end.shift()
    first = pd.Series(start.index == start.index.min(), index=start.index)
    idle = ~first & (gap > end - start)
    duration = by_step["duration_s"].first()
    keep = ~first & real & ~idle & (duration > 0)
    kv = steps.pivot(index="step", columns="rank", values="kv_tokens").fillna(0.0)
    pf = steps.pivot(index="step", columns="rank", values="prefill_tokens").fillna(0.0)
    return GroupSteps(
        duration_s=duration[keep].to_numpy(dtype=np.float64),
        kv_tokens=kv[keep].to_numpy(dtype=np.float64),
        prefill_tokens=pf[keep].to_numpy(dtype=np.float64),
        left_out={
            "first": int(first.sum()),
            "no_real_pass": int((~first & ~real).sum()),
            "after_idle": int((~first & real & idle).sum()),
        },
    )


def fit_cost(
    steps: pd.DataFrame, *, prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK, source: str = ""
) -> CostFit:
    """Fit ``t_fixed``, ``t_token`` and ``t_prefill`` (non-negative) to the group's steps."""
    table = group_steps(steps)
    k = table.duration_s.shape[0]
    if k < MIN_STEPS:
        raise UserError(f"{source or 'steps'}: {k} usable group steps, need {MIN_STEPS} to fit")
    y = table.duration_s
    coef = _refined(table)
    if coef[0] <= 0 and coef[1] <= 0:
        raise UserError(f"{source or 'steps'}: the fit gave a step that takes no time")
    cost = CostModel(
        t_fixed_s=float(coef[0]),
        t_token_s=float(coef[1]),
        t_comm_s=0.0,
        t_prefill_s=float(coef[2]),
        prefill_chunk_tokens=prefill_chunk_tokens,
    )
    predicted = cost.step_time(table.kv_tokens, table.prefill_tokens)
    total = float(((y - y.mean()) ** 2).sum())
    r2 = 1.0 - float(((y - predicted) ** 2).sum()) / total if total > 0 else float("nan")
    return CostFit(
        cost=cost,
        steps=k,
        prefill_steps=int((table.prefill_tokens.max(axis=1) > 0).sum()),
        r2=r2,
        median_abs_rel_error=float(np.median(np.abs(predicted - y) / y)),
        left_out=table.left_out,
        max_prefill_tokens=int(table.prefill_tokens.max()) if k else 0,
        source=source,
    )


def _nnls(kv: np.ndarray, prefill: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative ``(t_fixed, t_token, t_prefill)`` for ``y ~ t_fixed + t_token kv + ...``."""
    design = np.column_stack((np.ones(y.shape[0]), kv, prefill))
    scale = np.maximum(np.abs(design).max(axis=0), 1.0)  # columns of like size for nnls
    coef, _ = nnls(design / scale, y)
    return coef / scale


def _sse(coef: np.ndarray, table: GroupSteps) -> float:
    """Squared error of the model's own step formula with ``coef``."""
    work = coef[1] * table.kv_tokens + coef[2] * table.prefill_tokens
    return float(((coef[0] + work.max(axis=1) - table.duration_s) ** 2).sum())


def _refined(table: GroupSteps) -> np.ndarray:
    """The max-over-ranks fit, then refits on the slowest rank's tokens while that improves."""
    kv, pf, y = table.kv_tokens, table.prefill_tokens, table.duration_s
    best = _nnls(kv.max(axis=1), pf.max(axis=1), y)
    best_sse = _sse(best, table)
    rows = np.arange(y.shape[0])
    slowest = None
    coef = best
    for _ in range(REFINE_ROUNDS):
        g = np.argmax(coef[1] * kv + coef[2] * pf, axis=1)
        if slowest is not None and np.array_equal(g, slowest):
            break
        slowest = g
        coef = _nnls(kv[rows, g], pf[rows, g], y)
        sse = _sse(coef, table)
        if sse < best_sse:
            best, best_sse = coef, sse
    return best

"""Exact one-step optimisation ``IO_H`` (docs/design.md, "Exact optimisation"), solved as a MILP with HiGHS.

Choose which waiting requests to admit and where, admitting exactly ``U = min(|pool|, free
slots)`` (maximal), within free slots and an optional KV capacity, to minimise the discounted
projected imbalance ``sum_h gamma^h (G * max_g l_{g,h} - sum_g l_{g,h})`` where admitted requests
add ``s_j + h`` to their worker at offset ``h``. Small instances only: it measures the heuristics'
per-step optimality gap and stands in for ``IO_0`` in the theory check.

Variables: ``x_{jg}`` binary (request ``j`` to worker ``g``), ``M_h`` continuous (the max at
``h``). Constraints: each request at most once, ``sum_j x_{jg} <= c_g``, ``sum x = U``,
``M_h >= L_{g,h} + sum_j x_{jg} (s_j + h)``, and ``L_{g,h} + ... <= C`` with a capacity.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.scoring import discount_weights
from balanceroute.router.policies.state import Admissions, RouterState


@dataclass(frozen=True, slots=True)
class StepSolution:
    """An optimal (or best-found) step: candidate indices, their workers, the objective."""

    requests: np.ndarray  # indices into the candidate list
    workers: np.ndarray
    objective: float
    optimal: bool


def step_objective(
    loads: np.ndarray, prompts: np.ndarray, requests, workers, gamma: float = 1.0
) -> float:
    """Discounted projected imbalance after admitting ``requests`` to ``workers``.

    ``loads`` is ``(G, H+1)`` (projected loads before the step; ``H = 0`` is the current one).
    """
    g_count, h1 = loads.shape
    after = loads.astype(np.float64).copy()
    hs = np.arange(h1, dtype=np.float64)
    for j, g in zip(np.asarray(requests).tolist(), np.asarray(workers).tolist(), strict=True):
        after[g] += prompts[j] + hs
    per_h = g_count * after.max(axis=0) - after.sum(axis=0)
    return float(per_h @ discount_weights(h1 - 1, gamma))


def solve_step(
    loads: np.ndarray,
    free: np.ndarray,
    prompts: np.ndarray,
    *,
    gamma: float = 1.0,
    kv_capacity: float | None = None,
    time_limit_s: float = 10.0,
) -> StepSolution:
    """Solve ``IO_H`` for one step: ``loads`` ``(G, H+1)``, ``free`` ``(G,)``, ``prompts`` ``(n,)``."""
    loads = np.atleast_2d(np.asarray(loads, dtype=np.float64))
    if loads.shape[0] != np.asarray(free).shape[0]:
        loads = loads.T
    g_count, h1 = loads.shape
    free = np.asarray(free, dtype=np.int64)
    prompts = np.asarray(prompts, dtype=np.float64)
    n = prompts.shape[0]
    due = int(min(n, free.sum()))
    if due == 0:
        return StepSolution(
            np.zeros(0, np.int64),
            np.zeros(0, np.int64),
            step_objective(loads, prompts, [], [], gamma),
            True,
        )
    w = discount_weights(h1 - 1, gamma)
    hs = np.arange(h1, dtype=np.float64)
    # objective: sum_h w_h (G M_h - sum_g L_gh - sum_{j,g} x_jg (s_j + h))
    c_x = -np.repeat(prompts * w.sum() + hs @ w, g_count)  # x index j * G + g
    c = np.concatenate((c_x, g_count * w))
    a, lo_all, hi_all = _step_constraints(loads, free, prompts, due, kv_capacity)
    res = _solve_admitting_most(
        c, a, lo_all, hi_all, n, g_count, h1, due, kv_capacity, time_limit_s
    )
    x = np.round(res.x[: n * g_count]).reshape(n, g_count)
    req, wk = np.nonzero(x > 0.5)
    obj = step_objective(loads, prompts, req, wk, gamma)
    return StepSolution(req.astype(np.int64), wk.astype(np.int64), obj, bool(res.status == 0))


def _step_constraints(
    loads: np.ndarray,
    free: np.ndarray,
    prompts: np.ndarray,
    due: int,
    kv_capacity: float | None,
) -> tuple[Any, np.ndarray, np.ndarray]:
    """The constraint rows of ``IO_H`` over ``x_{jg}`` then ``M_h``, and their bounds: each
    request at most once, free slots per worker, ``due`` admissions (row ``n + G``), the max
    at every ``h`` and, with a KV capacity, the capacity at every ``h``."""
    from scipy.sparse import coo_matrix, vstack

    g_count, h1 = loads.shape
    n = prompts.shape[0]
    nx = n * g_count
    rows = []
    lo, hi = [], []
    j_idx = np.repeat(np.arange(n), g_count)
    g_idx = np.tile(np.arange(g_count), n)
    cols = np.arange(nx)
    # each request at most once
    rows.append(coo_matrix((np.ones(nx), (j_idx, cols)), shape=(n, nx + h1)))
    lo.append(np.zeros(n))
    hi.append(np.ones(n))
    # free slots per worker
    rows.append(coo_matrix((np.ones(nx), (g_idx, cols)), shape=(g_count, nx + h1)))
    lo.append(np.zeros(g_count))
    hi.append(free.astype(np.float64))
    # maximal admission
    rows.append(coo_matrix((np.ones(nx), (np.zeros(nx, np.int64), cols)), shape=(1, nx + h1)))
    lo.append(np.array([due]))
    hi.append(np.array([due]))
    # M_h - sum_j x_jg (s_j + h) >= L_gh  (and <= C - L_gh for the capacity)
    for h in range(h1):
        data = np.concatenate((-(prompts[j_idx] + h), np.ones(g_count)))
        r = np.concatenate((g_idx, np.arange(g_count)))
        cc = np.concatenate((cols, np.full(g_count, nx + h)))
        rows.append(coo_matrix((data, (r, cc)), shape=(g_count, nx + h1)))
        lo.append(loads[:, h])
        hi.append(np.full(g_count, np.inf))
        if kv_capacity is not None:
            rows.append(coo_matrix(((prompts[j_idx] + h), (g_idx, cols)), shape=(g_count, nx + h1)))
            lo.append(np.full(g_count, -np.inf))
            hi.append(kv_capacity - loads[:, h])
    return vstack(rows).tocsr(), np.concatenate(lo), np.concatenate(hi)


def _solve_admitting_most(
    c: np.ndarray,
    a: Any,
    lo_all: np.ndarray,
    hi_all: np.ndarray,
    n: int,
    g_count: int,
    h1: int,
    due: int,
    kv_capacity: float | None,
    time_limit_s: float,
) -> Any:
    """HiGHS on the MILP, admitting ``due`` requests; with a KV capacity the full ``due`` may
    not fit, so one fewer each time until a step is feasible. Raises if none is."""
    from scipy.optimize import Bounds, LinearConstraint, milp

    nx = n * g_count
    integrality = np.concatenate((np.ones(nx), np.zeros(h1)))
    bounds = Bounds(
        np.concatenate((np.zeros(nx), np.full(h1, -np.inf))),
        np.concatenate((np.ones(nx), np.full(h1, np.inf))),
    )
    count_row = n + g_count
    while True:
        # With a KV capacity the full U may not fit: admit the most that fit, then optimise.
        lo_all[count_row] = hi_all[count_row] = due
        res = milp(
            c,
            constraints=LinearConstraint(a, lo_all, hi_all),
            integrality=integrality,
            bounds=bounds,
            options={"time_limit": time_limit_s, "disp": False, "mip_rel_gap": 0.0},  # exact: HiGHS stops at 1e-4 otherwise
        )
        if res.x is not None or kv_capacity is None or due == 0:
            break
        due -= 1
    if res.x is None:
        raise RuntimeError(f"MILP found no feasible step: {res.message}")
    return res


def best_single(loads: np.ndarray, free: np.ndarray, prompts: np.ndarray) -> tuple[int, int]:
    """Exact ``IO_0`` when one request is due: every (request, open worker) pair, vectorized.

    Admitting ``s`` to worker ``g`` gives ``I = G * max(M, L_g + s) - (sum L + s)``.
    """
    open_ = np.flatnonzero(free > 0)
    top = loads.max()
    after = np.maximum(top, loads[open_][:, None] + prompts[None, :])
    cost = loads.shape[0] * after - prompts[None, :]
    flat = int(np.argmin(cost.T))  # request-major: ties go to the oldest request
    j, gi = divmod(flat, open_.size)
    return j, int(open_[gi])


class ExactPolicy(Policy):
    """``IO_0``: the exact current-imbalance step over the first ``candidates`` waiting requests.

    A reference for the theory check and the optimality-gap study, far too slow for serving.
    """

    name = "exact"
    batches = True

    def __init__(self, candidates: int = 32, time_limit_s: float = 5.0) -> None:
        self.candidates = candidates
        self.time_limit_s = time_limit_s

    def route(self, state: RouterState) -> Admissions:
        due = state.admissions_due
        if due == 0:
            return Admissions.empty()
        cand = state.pool.head(max(due, self.candidates))
        prompts = state.requests.prompt_tokens[cand].astype(np.float64)
        if due == 1:
            j, g = best_single(state.loads, state.free_slots, prompts)
            return Admissions(cand[[j]], np.array([g], dtype=np.int64))
        sol = solve_step(
            state.loads[:, None], state.free_slots, prompts, time_limit_s=self.time_limit_s
        )
        order = np.argsort(sol.requests, kind="stable")
        return Admissions(cand[sol.requests[order]], sol.workers[order])

    def describe(self) -> dict:
        return {"name": self.name, "candidates": self.candidates, "time_limit_s": self.time_limit_s}

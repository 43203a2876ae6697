"""One routing decision on a posted snapshot, made and checked the way the simulator does.

The snapshot becomes the router's own types: a :class:`RequestTable` whose positions are the
running requests (in worker order) followed by the pool (in release order), an
:class:`ArrayPool`, and :class:`RunningRequests`. The policy is built fresh for every call (no
state leaks between callers), reset with a :class:`RunContext`, asked once, and its decision is
validated (pool membership, no duplicates, free slots, maximality) before it is returned.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.router.policies.admission import admission_violation
from balanceroute.router.policies.balance_route import BalanceRoutePolicy
from balanceroute.router.policies.kernels import compile_kernels
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.registry import policy_class, policy_names
from balanceroute.router.policies.state import (
    Admissions,
    ArrayPool,
    RequestTable,
    RouterState,
    RunningRequests,
)
from balanceroute.serving.service.decode import key_column, running_from_models
from balanceroute.serving.service.route_schemas import RouteRequest


class InvalidOptions(ValueError):
    """Options the policy refuses (names it does not take, or values out of range)."""


class DecisionError(RuntimeError):
    """The policy broke an invariant: a bug in the policy, not in the request."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """The router's view of a posted state, and the pool ids to answer with."""

    state: RouterState
    context: RunContext
    pool_ids: list[int | str]
    running: int


def build_snapshot(req: RouteRequest) -> Snapshot:
    """Router state and run context from a validated ``RouteRequest``."""
    g_count = len(req.workers)
    per_worker = [len(w.running) for w in req.workers]
    run = running_from_models([r for w in req.workers for r in w.running])
    worker = np.repeat(np.arange(g_count, dtype=np.int64), per_worker)
    n_run = run.size
    pool = req.pool
    pool_prompt = np.array([p.prompt_tokens for p in pool], dtype=np.int64)
    pool_key = key_column([p.prompt_key for p in pool])
    assert pool_key is not None  # validated keys always decode
    table = RequestTable(
        prompt_tokens=np.concatenate((run.prompt_tokens, pool_prompt)),
        prompt_key=np.concatenate((run.prompt_key, pool_key)),
        trace_index=np.arange(n_run + len(pool), dtype=np.int64),
    )
    workload = run.prompt_tokens + run.age
    running = RunningRequests(
        position=np.arange(n_run, dtype=np.int64),
        worker=worker,
        workload=workload,
        age=run.age,
        prompt_tokens=run.prompt_tokens,
    )
    summed = np.bincount(worker, weights=workload.astype(np.float64), minlength=g_count)
    loads = np.array(
        [summed[g] if w.load is None else w.load for g, w in enumerate(req.workers)],
        dtype=np.float64,
    )
    active = np.bincount(worker, minlength=g_count).astype(np.int64)
    free = np.array([w.free_slots for w in req.workers], dtype=np.int64)
    array_pool = ArrayPool(
        positions=n_run + np.arange(len(pool), dtype=np.int64),
        waited_iterations=np.array([p.waited_iterations for p in pool], dtype=np.int64),
        waited_seconds=np.array([p.waited_s for p in pool], dtype=np.float64),
        overtaken=np.array([p.overtaken for p in pool], dtype=np.int64),
    )
    state = RouterState(
        iteration=req.iteration,
        time_s=req.time_s,
        free_slots=free,
        active=active,
        pool=array_pool,
        requests=table,
        running_source=lambda: running,
        loads_source=lambda: loads,
    )
    slots = req.slots or max(1, int((active + free).max()))
    context = RunContext(workers=g_count, slots=slots, requests=table, seed=req.seed)
    return Snapshot(state, context, [p.id for p in pool], n_run)


def lookahead(req: RouteRequest) -> int:
    """Iterations the requested policy projects ahead (0: it uses no completion estimator)."""
    cls = policy_class(req.policy)
    if not cls.takes_estimator:
        return 0
    horizon = (req.options.overrides() if req.options is not None else {}).get("horizon")
    return cls.defaults.horizon if horizon is None else horizon


def make_policy(req: RouteRequest, estimator: CompletionEstimator | None) -> Policy:
    """A fresh policy named by the request, with its options (BalanceRoute ones only)."""
    cls = policy_class(req.policy)
    options = req.options.overrides() if req.options is not None else {}
    if cls.options is None:
        if options:
            raise InvalidOptions(f"router '{req.policy}' takes no options (got {sorted(options)})")
        return cls()
    try:
        return cls(estimator=estimator, **options)
    except UserError as exc:
        raise InvalidOptions(str(exc)) from None


def check_decision(adm: Admissions, snap: Snapshot, maximal: bool) -> None:
    """The simulator's invariants: pool members only, once each, free slots, maximality."""
    state = snap.state
    lo, hi = snap.running, snap.running + state.pool.size
    problem = admission_violation(
        adm.positions.tolist(),
        adm.workers.tolist(),
        due=state.admissions_due,
        free=state.free_slots.tolist(),
        maximal=maximal,
        waiting=lambda p: lo <= p < hi,
    )
    if problem is not None:
        raise DecisionError(problem)


TwinSource = Callable[[], float]


def apply_blend(policy: Policy, twin: TwinSource | None) -> float | None:
    """The blend weight a BR-H policy routes with in the service (docs/design.md, "The twin
    live"): a twin-driven one the twin's (``twin``, read now), else ``w = 0`` where the guard
    would run (a guard cannot learn within one call: it would step aside); None: the policy as
    it is (a fixed ``blend``, ``guard=false``, or no estimator)."""
    if not isinstance(policy, BalanceRoutePolicy):
        return None
    if policy.twin_managed and twin is not None:
        policy.set_blend(twin())
    elif policy.guard is not None:
        policy.set_blend(0.0)
    else:
        return None
    return policy.blend


def decide(
    req: RouteRequest, estimator: CompletionEstimator | None, twin: TwinSource | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Admissions ``[{id, worker}]`` in order and the resolved policy configuration; ``twin``
    gives a twin-driven policy its live twin's weight (see ``serving.service.twin_cache``)."""
    snap = build_snapshot(req)
    policy = make_policy(req, estimator)
    try:
        policy.reset(snap.context)
    except UserError as exc:
        raise InvalidOptions(str(exc)) from None
    weight = apply_blend(policy, twin)
    adm = policy.route(snap.state)
    check_decision(adm, snap, policy.maximal)
    offset = snap.running
    admissions = [
        {"id": snap.pool_ids[p - offset], "worker": g}
        for p, g in zip(adm.positions.tolist(), adm.workers.tolist(), strict=True)
    ]
    described = policy.describe()
    if weight is not None:
        described["blend_used"] = weight
    return admissions, described


def prediction_free(horizon: int) -> CompletionEstimator:
    """The ``none`` estimator: BR-H's answer when the model cannot be used."""
    return NoPrediction(horizon=max(1, horizon)).fit()


def warm_router() -> None:
    """Route one tiny snapshot with every served policy, so one-time costs (JIT compilation of
    the router's kernels) are paid at startup rather than by the first caller."""
    compile_kernels()
    body = {
        "workers": [{"free_slots": 1, "running": [{"id": 0, "prompt_tokens": 8, "age": 1}]}],
        "pool": [{"id": 1, "prompt_tokens": 4}],
    }
    for name in policy_names(live=True):
        req = RouteRequest.model_validate({**body, "policy": name})
        horizon = lookahead(req)
        decide(req, prediction_free(horizon) if horizon else None)

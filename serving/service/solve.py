"""The exact optimum of one posted routing step beside the heuristic's decision on it.

Reads a state in the ``POST /v1/route`` body format, runs the named BalanceRoute policy on it,
solves ``IO_H`` exactly over the same candidates with HiGHS, and reports both decisions, their
discounted projected imbalance and the gap (``balanceroute solve-step``; small instances only).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import ValidationError

from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import load_estimator
from balanceroute.router.policies.balance_route import BalanceRoutePolicy
from balanceroute.router.policies.exact import solve_step, step_objective
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.service.snapshot import build_snapshot, make_policy


def read_route_request(path: str | Path) -> RouteRequest:
    """A ``POST /v1/route`` body from a file; a UserError naming the file and field at fault."""
    try:
        return RouteRequest.model_validate_json(Path(path).read_bytes())
    except FileNotFoundError:
        raise UserError(f"state file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"state file {path} is a directory") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise UserError(f"{path}: {where}: {first['msg']}") from None


def solve_posted_step(
    path: str | Path, *, model_uri: str | None, candidates: int, time_limit_s: float
) -> dict[str, Any]:
    """The heuristic's and the exact decision on the state in ``path``, with their objectives."""
    req = read_route_request(path)
    estimator = load_estimator(model_uri) if model_uri else None
    snap = build_snapshot(req)
    policy = make_policy(req, estimator)
    if not isinstance(policy, BalanceRoutePolicy):
        raise UserError("solve-step compares BalanceRoute policies (br0, brh, brh-paper)")
    policy.reset(snap.context)
    state = snap.state
    cfg = policy.config
    due = state.admissions_due
    window = due + max(cfg.window, cfg.r_max)
    cand = state.pool.head(max(window, due + candidates))
    prompts = state.requests.prompt_tokens[cand].astype(float)
    loads = policy.projected_loads(state, prompts[:window])
    adm = policy.route(state)
    where = {int(p): j for j, p in enumerate(cand.tolist())}
    chosen = [where[int(p)] for p in adm.positions.tolist()]
    heur = step_objective(loads, prompts, chosen, adm.workers.tolist(), policy.gamma)
    sol = solve_step(
        loads,
        state.free_slots,
        prompts,
        gamma=policy.gamma,
        kv_capacity=cfg.kv_capacity,
        time_limit_s=time_limit_s,
    )

    def named(idx: list[int], wk: list[int]) -> list[dict[str, Any]]:
        return [
            {"id": snap.pool_ids[int(cand[i]) - snap.running], "worker": int(g)}
            for i, g in zip(idx, wk, strict=True)
        ]

    before = step_objective(loads, prompts, [], [], policy.gamma)
    return {
        "policy": policy.describe(),
        "candidates": len(cand),
        "objective_before": before,
        "heuristic": {"admissions": named(chosen, adm.workers.tolist()), "objective": heur},
        "exact": {
            "admissions": named(sol.requests.tolist(), sol.workers.tolist()),
            "objective": sol.objective,
            "proven_optimal": sol.optimal,
        },
        "gap": (heur - sol.objective) / max(before, 1.0),
    }

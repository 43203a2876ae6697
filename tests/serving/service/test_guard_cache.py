"""The do-no-harm guard across /v1/route calls: departures seen as ids that leave, verdicts
kept per (arm, policy), its state in /metrics."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.policies.guard import MIN_SNAPSHOTS
from balanceroute.serving.service.guard_cache import RouteGuards
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.service.snapshot import decide
from tests.router.helpers import frame
from tests.serving.service.helpers import Server, post


def _body(k: int, running: list[list[dict]], pool: list[dict]) -> dict:
    return {
        "policy": "brh",
        "options": {"horizon": 8, "guard_stride": 1},
        "workers": [{"free_slots": 4 - len(r), "running": r} for r in running],
        "pool": pool,
        "slots": 4,
        "iteration": k,
    }


def test_departures_are_ids_that_leave_and_the_guard_scores_decisions():
    """A dispatcher that calls every iteration: running requests age by one, finish, and the
    admitted ones show up as running; the guard judges its snapshots once H has passed."""
    rng = np.random.default_rng(0)
    est = SurvivalEstimator(horizon=8).fit(
        frame(rng.integers(10, 900, 300), rng.integers(1, 9, 300))
    )
    guards = RouteGuards()
    running: list[list[dict]] = [[], []]
    remaining: dict[str, int] = {}
    next_id = 0
    for k in range(60):
        for w in running:  # finish, then age the others
            w[:] = [r for r in w if remaining[r["id"]] > 1]
            for r in w:
                remaining[r["id"]] -= 1
                r["age"] += 1
        pool = [
            {"id": f"p{next_id + j}", "prompt_tokens": int(rng.integers(10, 900))} for j in range(6)
        ]
        req = RouteRequest.model_validate(_body(k, running, pool))
        posted = sum(len(w) for w in running)
        admissions, _ = decide(
            req, est, lambda pol, req=req: guards.for_call("a", "brh", pol.config, req)
        )
        by_id = {p["id"]: p for p in pool}
        for a in admissions:
            p = by_id[a["id"]]
            running[a["worker"]].append(
                {"id": a["id"], "prompt_tokens": p["prompt_tokens"], "age": 0}
            )
            remaining[a["id"]] = int(rng.integers(1, 9))
        next_id += 6
    guard = guards.peek("a", "brh")
    assert guard is not None and guard.scored >= MIN_SNAPSHOTS
    assert guard.taken.any()  # departures reached the snapshots
    assert len(guards._tracked[("a", "brh")].running) == posted  # the last call's ids only
    guards.drop("a")
    assert guards.peek("a", "brh") is None


@pytest.mark.server
def test_route_calls_expose_the_guard_in_metrics(module_server: Server) -> None:
    body = {
        "policy": "brh",
        "workers": [
            {"free_slots": 1, "running": [{"id": "r1", "prompt_tokens": 900, "age": 3}]},
            {"free_slots": 1, "running": []},
        ],
        "pool": [{"id": "x", "prompt_tokens": 50}, {"id": "y", "prompt_tokens": 70}],
        "iteration": 10,
    }
    with module_server.client() as c:
        assert post(c, "/v1/route", body).status_code == 200
        text = c.get("/metrics").text
    assert 'balanceroute_route_guard_weight{arm="a",policy="brh"} 0.0' in text
    assert 'balanceroute_route_guard_snapshots{arm="a",policy="brh"}' in text

"""The service's live prediction quality: what the model predicted for each request ``/v1/route``
admitted, scored against the output length the later snapshots show when it finishes."""

from __future__ import annotations

import math
import threading

import numpy as np

from balanceroute.predict.live_quality import (
    LIVE_QUALITY_METRICS,
    LIVE_WINDOW,
    LiveQuality,
    stamp,
)
from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.service.snapshot import decide
from balanceroute.serving.service.twin_cache import RouteTwins
from tests.router.helpers import frame

G, B, H = 2, 4, 8


def test_route_admissions_are_scored_when_the_snapshots_show_them_finish():
    rng = np.random.default_rng(0)
    est = SurvivalEstimator(horizon=H).fit(frame(rng.integers(10, 900, 300),
                                                 rng.integers(1, 17, 300)))  # fmt: skip
    stamp(est, "surv", "1", {"brier": 0.2})
    twins = RouteTwins()
    twins.quality = LiveQuality(window=60, min_finished=50)
    finished: dict[str, int] = {}
    score = twins.quality.finish
    twins.quality.finish = lambda key, tokens: (
        finished.setdefault(key[2], tokens) and score(key, tokens)
    )
    lock = threading.Lock()
    running: list[list[dict]] = [[] for _ in range(G)]
    pool: list[dict] = []
    output: dict[str, int] = {}
    remaining: dict[str, int] = {}
    try:
        for k in range(400):
            for w in running:  # finish, then age the others (the caller calls every iteration)
                w[:] = [r for r in w if remaining[r["id"]] > 1]
                for r in w:
                    remaining[r["id"]] -= 1
                    r["age"] += 1
            for _ in range(int(rng.binomial(2, 0.4))):
                rid = f"p{len(output)}"
                output[rid] = int(rng.integers(1, 17))  # within H = 8 and beyond
                pool.append({"id": rid, "prompt_tokens": int(rng.integers(10, 900)),
                             "waited_s": 0.0})  # fmt: skip
            body = {"policy": "brh", "options": {"horizon": H}, "slots": B, "iteration": k,
                    "time_s": 0.05 * k, "pool": pool,
                    "workers": [{"free_slots": B - len(r), "running": r} for r in running]}  # fmt: skip
            req = RouteRequest.model_validate(body)
            admissions, described = decide(
                req, est, lambda req=req: twins.for_call("a", "brh", req, est, lock)
            )
            assert "blend_used" in described
            twins.admitted("a", "brh", [a["id"] for a in admissions], k, req, est)
            by_id = {p["id"]: p for p in pool}
            for a in admissions:
                p = by_id.pop(a["id"])
                running[a["worker"]].append({"id": a["id"], "prompt_tokens": p["prompt_tokens"],
                                             "age": 0})  # fmt: skip
                remaining[a["id"]] = output[a["id"]]
            pool = list(by_id.values())
    finally:
        twins.stop()
    assert len(finished) >= 60
    assert all(tokens == output[rid] for rid, tokens in finished.items())  # the true lengths
    values = twins.quality.scores()[("surv", "1")]
    assert values[LIVE_WINDOW] == 60
    assert all(math.isfinite(values[m]) for m in LIVE_QUALITY_METRICS), values
    # still pending: only requests admitted and not yet seen finish
    assert len(twins.quality.pending) <= sum(len(w) for w in running)

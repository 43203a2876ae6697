"""``POST /v1/route``: the decision over HTTP equals the in-process policy's on the same state."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from balanceroute.router.policies.policy import RunContext
from balanceroute.router.policies.registry import policy_class, policy_names
from balanceroute.router.policies.state import ArrayPool, RequestTable, RouterState, RunningRequests
from tests.serving.service.helpers import Server, load_model, post

pytestmark = pytest.mark.server
SERVER_ARMS = ("exactmatch", "survival")
SLOTS = 12
SERVED = policy_names(live=True)


def random_state(seed: int, key_pool: np.ndarray) -> dict:
    """A snapshot as arrays: G workers, their running requests, a pool with waits."""
    rng = np.random.default_rng(seed)
    g = int(rng.integers(2, 9))
    per = rng.integers(0, SLOTS - 2, g)
    free = np.minimum(rng.integers(0, 5, g), SLOTS - per)
    r = int(per.sum())
    p = int(rng.integers(0, 40))
    return {
        "worker": np.repeat(np.arange(g), per),
        "free": free,
        "run_prompt": rng.integers(1, 9000, r),
        "run_age": rng.integers(0, 2500, r),
        "run_key": key_pool[rng.integers(0, key_pool.size, r)],
        "pool_prompt": rng.integers(1, 9000, p),
        "pool_key": key_pool[rng.integers(0, key_pool.size, p)],
        "waited_s": rng.uniform(0, 30, p),
        "waited_it": rng.integers(0, 500, p),
        "overtaken": rng.integers(0, 1100, p),
        "iteration": int(rng.integers(0, 10_000)),
        "seed": seed,
    }


def as_body(s: dict, policy: str, options: dict | None) -> dict:
    g = s["free"].shape[0]
    workers = [{"free_slots": int(s["free"][w]), "running": []} for w in range(g)]
    for j, w in enumerate(s["worker"].tolist()):
        workers[w]["running"].append(
            {
                "id": f"r{j}",
                "prompt_tokens": int(s["run_prompt"][j]),
                "age": int(s["run_age"][j]),
                "prompt_key": int(s["run_key"][j]),
            }
        )
    pool = [
        {
            "id": f"p{j}",
            "prompt_tokens": int(s["pool_prompt"][j]),
            "prompt_key": int(s["pool_key"][j]),
            "waited_s": float(s["waited_s"][j]),
            "waited_iterations": int(s["waited_it"][j]),
            "overtaken": int(s["overtaken"][j]),
        }
        for j in range(s["pool_prompt"].shape[0])
    ]
    body = {
        "policy": policy,
        "workers": workers,
        "pool": pool,
        "slots": SLOTS,
        "iteration": s["iteration"],
        "time_s": 100.0,
        "seed": s["seed"],
    }
    if options is not None:
        body["options"] = options
    return body


def in_process(s: dict, policy: str, options: dict | None, estimator) -> list[tuple[str, int]]:
    """The same decision made directly on router types."""
    r = s["run_prompt"].shape[0]
    p = s["pool_prompt"].shape[0]
    g = s["free"].shape[0]
    table = RequestTable(
        prompt_tokens=np.concatenate((s["run_prompt"], s["pool_prompt"])).astype(np.int64),
        prompt_key=np.concatenate((s["run_key"], s["pool_key"])).astype(np.uint64),
        trace_index=np.arange(r + p),
    )
    workload = (s["run_prompt"] + s["run_age"]).astype(np.int64)
    running = RunningRequests(
        position=np.arange(r),
        worker=s["worker"].astype(np.int64),
        workload=workload,
        age=s["run_age"].astype(np.int64),
        prompt_tokens=s["run_prompt"].astype(np.int64),
    )
    state = RouterState(
        iteration=s["iteration"],
        time_s=100.0,
        free_slots=s["free"].astype(np.int64),
        active=np.bincount(s["worker"], minlength=g).astype(np.int64),
        pool=ArrayPool(r + np.arange(p), s["waited_it"], s["waited_s"], s["overtaken"]),
        requests=table,
        running_source=lambda: running,
        loads_source=lambda: np.bincount(s["worker"], weights=workload, minlength=g),
    )
    cls = policy_class(policy)
    pol = cls(estimator=estimator, **(options or {})) if cls.options else cls()
    pol.reset(RunContext(g, SLOTS, table, seed=s["seed"]))
    adm = pol.route(state)
    return [(f"p{i - r}", int(w)) for i, w in zip(adm.positions, adm.workers, strict=True)]


CASES = [(name, None) for name in SERVED] + [
    ("brh", {"s_greedy": 0, "projection": "expected", "gamma": 0.95, "beta": 43.0}),
    ("brh", {"refill": True, "horizon": 40, "penalty": "max"}),
    ("br0", {"beta": 14.67, "window": 8}),
]


@pytest.mark.parametrize(("policy", "options"), CASES)
def test_http_decision_equals_in_process(
    module_server: Server, model_dir: Path, key_pool: np.ndarray, policy: str, options
) -> None:
    estimator = (
        load_model(model_dir, "exactmatch") if policy_class(policy).takes_estimator else None
    )
    with module_server.client() as c:
        for seed in range(4):
            s = random_state(seed, key_pool)
            resp = post(c, "/v1/route", as_body(s, policy, options))
            assert resp.status_code == 200, resp.text
            got = [(a["id"], a["worker"]) for a in resp.json()["admissions"]]
            assert got == in_process(s, policy, options, estimator), (policy, seed)
            if policy_class(policy).takes_estimator:
                assert resp.json()["model"]["kind"] == "exactmatch"
                assert resp.json()["policy"]["estimator"] == "exactmatch"


def test_the_model_selector_picks_the_estimator(module_server: Server, key_pool) -> None:
    body = as_body(random_state(11, key_pool), "brh", None) | {"model": "b"}
    with module_server.client() as c:
        resp = post(c, "/v1/route", body)
    assert resp.json()["model"]["arm"] == "b"
    assert resp.json()["policy"]["estimator"] == "survival"


def test_loads_default_to_running_workloads_and_can_be_given(module_server: Server) -> None:
    workers = [
        {"free_slots": 1, "running": [{"id": 1, "prompt_tokens": 900, "age": 100}]},
        {"free_slots": 1, "running": []},
    ]
    pool = [{"id": "x", "prompt_tokens": 50}]
    with module_server.client() as c:
        default = post(c, "/v1/route", {"policy": "token-jsq", "workers": workers, "pool": pool})
        workers[1]["load"] = 5000.0
        given = post(c, "/v1/route", {"policy": "token-jsq", "workers": workers, "pool": pool})
    assert default.json()["admissions"] == [{"id": "x", "worker": 1}]
    assert given.json()["admissions"] == [{"id": "x", "worker": 0}]


def test_unknown_policy_is_422_listing_the_known_ones(module_server: Server) -> None:
    body = {"policy": "jsq", "workers": [{"free_slots": 1}], "pool": []}
    with module_server.client() as c:
        resp = post(c, "/v1/route", body)
    assert resp.status_code == 422
    err = resp.json()["detail"][0]
    assert err["loc"] == ["body", "policy"]
    assert all(f"'{name}'" in err["msg"] for name in SERVED)


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"policy": "count-jsq", "options": {"horizon": 3}}, ["body", "options"]),
        ({"policy": "brh", "options": {"gamma": 0}}, ["body", "options"]),
        ({"policy": "brh", "options": {"horizon": None}}, ["body", "options", "horizon"]),
        ({"policy": "brh", "options": {"r_max": 9}}, ["body", "options", "r_max"]),
        ({"policy": "brh", "options": {"horizn": 3}}, ["body", "options", "horizn"]),
        ({"policy": "brh", "options": {"horizon": 120}}, ["body", "options"]),
        ({"policy": "brh", "model": "zzz"}, ["body", "model"]),
        ({"workers": []}, ["body", "workers"]),
        ({"workers": [{"free_slots": -1}]}, ["body", "workers", 0, "free_slots"]),
        ({"workers": [{"free_slots": 1, "load": -5.0}]}, ["body", "workers", 0, "load"]),
        (
            {"pool": [{"id": 1, "prompt_tokens": 5}, {"id": 1, "prompt_tokens": 6}]},
            ["body", "pool"],
        ),
        (
            {"pool": [{"id": 1, "prompt_tokens": 5, "waited_s": -1}]},
            ["body", "pool", 0, "waited_s"],
        ),
    ],
)
def test_bad_snapshots_are_422(module_server: Server, body: dict, loc: list) -> None:
    base = {
        "policy": "br0",
        "workers": [{"free_slots": 2}],
        "pool": [{"id": 0, "prompt_tokens": 9}],
    }
    with module_server.client() as c:
        resp = post(c, "/v1/route", base | body)
    assert resp.status_code == 422, resp.text
    assert loc in [e["loc"][: len(loc)] for e in resp.json()["detail"]], resp.json()


def test_oversized_pool_is_413(module_server: Server) -> None:
    pool = [{"id": j, "prompt_tokens": 5} for j in range(16_385)]
    with module_server.client() as c:
        resp = post(c, "/v1/route", {"policy": "br0", "workers": [{"free_slots": 1}], "pool": pool})
    assert resp.status_code == 413
    assert "16384" in resp.json()["detail"]

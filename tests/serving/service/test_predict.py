"""``POST /v1/predict`` and ``/v1/observe`` over real HTTP against the in-process estimators."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import orjson
import pytest

from balanceroute.predict.base import CompletedBatch, RunningBatch
from tests.serving.service.helpers import Server, completion_rows, load_model, post, random_running

pytestmark = pytest.mark.server
SERVER_ARMS = ("gbdt", "exactmatch")


@pytest.fixture(scope="module")
def mirrors(model_dir: Path) -> dict:
    """In-process copies of the server's two arms, fed the same observations."""
    return {"a": load_model(model_dir, "gbdt"), "b": load_model(model_dir, "exactmatch")}


def _predict_local(est, req: dict, time_s: float, survival: bool):
    batch = RunningBatch(req["prompt"], req["age"], req["keys"], time_s=time_s)
    return est.predict(batch, survival=survival)


@pytest.mark.parametrize("arm", ["a", "b"])
@pytest.mark.parametrize("survival", [False, True])
def test_predictions_equal_in_process_bit_for_bit(
    module_server: Server, mirrors: dict, key_pool: np.ndarray, arm: str, survival: bool
) -> None:
    rng = np.random.default_rng(7)
    req = random_running(rng, 300, key_pool)
    body = {"requests": req["rows"], "model": arm, "survival": survival, "time_s": 1234.5}
    with module_server.client() as c:
        resp = post(c, "/v1/predict", body)
    assert resp.status_code == 200, resp.text
    got = orjson.loads(resp.content)
    want = _predict_local(mirrors[arm], req, 1234.5, survival)
    assert got["model"]["arm"] == arm
    assert got["model"]["kind"] == mirrors[arm].name
    assert got["ids"] == list(range(300))
    assert got["horizon"] == mirrors[arm].horizon
    assert np.array_equal(np.array(got["p_finish"]), want.p_finish)
    assert np.array_equal(np.array(got["c"]), want.c)
    if survival:
        assert np.array_equal(np.array(got["survival"]), want.survival)
    else:
        assert got["survival"] is None


def test_observe_feeds_every_arm_like_in_process(
    module_server: Server, mirrors: dict, history, key_pool: np.ndarray
) -> None:
    done = completion_rows(history, key_pool, 200)
    tail, keys, times, rows = done["tail"], done["keys"], done["times"], done["rows"]
    with module_server.client() as c:
        resp = post(c, "/v1/observe", {"completions": rows})
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"observed": 200, "arms": ["a", "b"]}
        done = CompletedBatch(
            tail["prompt_tokens"].to_numpy(), tail["output_tokens"].to_numpy(), keys, times
        )
        for est in mirrors.values():
            est.observe(done)
        req = random_running(np.random.default_rng(8), 64, key_pool)
        for arm, est in mirrors.items():
            got = post(c, "/v1/predict", {"requests": req["rows"], "model": arm, "time_s": 5101.0})
            want = _predict_local(est, req, 5101.0, False)
            assert np.array_equal(np.array(got.json()["p_finish"]), want.p_finish)
            assert np.array_equal(np.array(got.json()["c"]), want.c)


def test_string_keys_are_hashed_like_the_trace_loaders(
    module_server: Server, mirrors: dict, history
) -> None:
    from balanceroute.features.schema import hash_keys

    raw = history["prompt_key"].head(20).tolist()
    rows = [{"id": j, "prompt_tokens": 500, "age": 3, "prompt_key": k} for j, k in enumerate(raw)]
    with module_server.client() as c:
        got = post(c, "/v1/predict", {"requests": rows, "model": "b"}).json()
    batch = RunningBatch(np.full(20, 500), np.full(20, 3), hash_keys(raw))
    assert np.array_equal(np.array(got["c"]), mirrors["b"].predict(batch).c)


def test_a_shorter_horizon_is_read_off_the_survival_curves(
    module_server: Server, mirrors: dict, key_pool: np.ndarray
) -> None:
    req = random_running(np.random.default_rng(9), 50, key_pool)
    with module_server.client() as c:
        got = post(c, "/v1/predict", {"requests": req["rows"], "model": "b", "horizon": 40})
        too_far = post(c, "/v1/predict", {"requests": req["rows"], "model": "b", "horizon": 81})
    assert got.status_code == 200, got.text
    assert got.json()["horizon"] == 40
    est = mirrors["b"]
    est.horizon = 40
    try:
        want = _predict_local(est, req, None, False)
    finally:
        est.horizon = 80
    assert np.allclose(got.json()["p_finish"], want.p_finish, rtol=0, atol=1e-12)
    assert np.allclose(got.json()["c"], want.c, rtol=1e-12, atol=1e-9)
    assert too_far.status_code == 422
    assert too_far.json()["detail"][0]["loc"] == ["body", "horizon"]


def test_the_selector_picks_the_arm_by_label_version_or_alias(
    module_server: Server, model_dir: Path
) -> None:
    version_b = hashlib.sha256((model_dir / "exactmatch.joblib").read_bytes()).hexdigest()[:12]
    rows = [{"id": "r1", "prompt_tokens": 100, "age": 0}]
    with module_server.client() as c:
        kinds = {
            sel: post(c, "/v1/predict", {"requests": rows, "model": sel}).json()["model"]["kind"]
            for sel in ("a", "b", version_b)
        }
        default = post(c, "/v1/predict", {"requests": rows}).json()["model"]
        unknown = post(c, "/v1/predict", {"requests": rows, "model": "champion"})
    assert kinds == {"a": "gbdt", "b": "exactmatch", version_b: "exactmatch"}
    assert default["arm"] == "a"
    assert unknown.status_code == 422
    err = unknown.json()["detail"][0]
    assert err["loc"] == ["body", "model"]
    assert "known selectors: a" in err["msg"] and version_b in err["msg"]


def test_more_than_the_limit_is_413_naming_it(module_server: Server) -> None:
    rows = [{"id": j, "prompt_tokens": 10, "age": 0} for j in range(16_385)]
    with module_server.client() as c:
        resp = post(c, "/v1/predict", {"requests": rows})
        at_limit = post(c, "/v1/predict", {"requests": rows[:16_384]})
    assert resp.status_code == 413
    assert "16384" in resp.json()["detail"]
    assert at_limit.status_code == 200
    assert len(at_limit.json()["c"]) == 16_384


GOOD = {"id": 1, "prompt_tokens": 100, "age": 5}
BAD_BODIES = [
    (b"{not json", ["body", 1]),
    (b"", ["body"]),
    (b"[]", ["body"]),
    (b"NaN", ["body", 0]),
    (b'{"requests": [{"id": 1, "prompt_tokens": 100, "age": 1e400}]}', ["body"]),
    ({}, ["body", "requests"]),
    ({"requests": []}, ["body", "requests"]),
    ({"requests": "all"}, ["body", "requests"]),
    ({"requests": [GOOD | {"age": -1}]}, ["body", "requests", 0, "age"]),
    ({"requests": [GOOD | {"age": 2.5}]}, ["body", "requests", 0, "age"]),
    ({"requests": [GOOD | {"age": "5"}]}, ["body", "requests", 0, "age"]),
    ({"requests": [GOOD | {"age": True}]}, ["body", "requests", 0, "age"]),
    (
        b'{"requests": [{"id": 1, "prompt_tokens": 100, "age": 1180591620717411303424}]}',
        ["body", "requests", 0, "age"],
    ),
    ({"requests": [GOOD | {"prompt_tokens": 0}]}, ["body", "requests", 0, "prompt_tokens"]),
    ({"requests": [{"id": 1, "age": 5}]}, ["body", "requests", 0, "prompt_tokens"]),
    ({"requests": [{"prompt_tokens": 1, "age": 5}]}, ["body", "requests", 0, "id"]),
    ({"requests": [GOOD | {"id": 1.5}]}, ["body", "requests", 0, "id"]),
    ({"requests": [GOOD | {"prompt_key": -3}]}, ["body", "requests", 0, "prompt_key"]),
    ({"requests": [GOOD | {"prompt_key": [1]}]}, ["body", "requests", 0, "prompt_key"]),
    ({"requests": [GOOD, 7]}, ["body", "requests", 1]),
    ({"requests": [GOOD], "survival": "yes"}, ["body", "survival"]),
    ({"requests": [GOOD], "time_s": -1.0}, ["body", "time_s"]),
    ({"requests": [GOOD], "model": ""}, ["body", "model"]),
    ({"requests": [GOOD], "horizon": 0}, ["body", "horizon"]),
    ({"requests": [GOOD], "surival": True}, ["body", "surival"]),
]


@pytest.mark.parametrize(("body", "loc"), BAD_BODIES)
def test_bad_bodies_are_422_with_the_field_path(module_server: Server, body, loc) -> None:
    raw = body if isinstance(body, bytes) else orjson.dumps(body)
    with module_server.client() as c:
        resp = c.post("/v1/predict", content=raw, headers={"content-type": "application/json"})
    assert resp.status_code == 422, resp.text
    locs = [e["loc"][: len(loc)] for e in resp.json()["detail"]]
    assert loc in locs, resp.json()


@pytest.mark.parametrize(
    ("body", "loc"),
    [
        ({"completions": []}, ["body", "completions"]),
        ({"completions": [{"prompt_tokens": 5}]}, ["body", "completions", 0, "output_tokens"]),
        (
            {"completions": [{"prompt_tokens": 5, "output_tokens": -2}]},
            ["body", "completions", 0, "output_tokens"],
        ),
        (
            {"completions": [{"prompt_tokens": 5, "output_tokens": 2, "time_s": "now"}]},
            ["body", "completions", 0, "time_s"],
        ),
    ],
)
def test_bad_observations_are_422(module_server: Server, body, loc) -> None:
    with module_server.client() as c:
        resp = post(c, "/v1/observe", body)
    assert resp.status_code == 422
    assert loc in [e["loc"][: len(loc)] for e in resp.json()["detail"]]


def test_models_lists_both_arms_with_their_versions(module_server: Server, model_dir: Path) -> None:
    with module_server.client() as c:
        body = c.get("/v1/models").json()
    arms = {a["arm"]: a for a in body["arms"]}
    assert body["default"] == "a"
    assert arms["a"]["kind"] == "gbdt" and arms["b"]["kind"] == "exactmatch"
    digest = hashlib.sha256((model_dir / "gbdt.joblib").read_bytes()).hexdigest()[:12]
    assert arms["a"]["version"] == digest and arms["a"]["source"] == "file"
    assert arms["a"]["horizon"] == 80 and arms["a"]["params"]["n_estimators"] == 20
    assert {"a", "b", digest} <= set(body["selectors"])


def test_metrics_count_calls_per_endpoint_and_arm(module_server: Server) -> None:
    rows = [GOOD]
    with module_server.client() as c:
        post(c, "/v1/predict", {"requests": rows, "model": "b"})
        text = c.get("/metrics").text
    assert 'balanceroute_http_requests_total{arm="b",endpoint="/v1/predict",status="200"}' in text
    assert 'balanceroute_http_request_seconds_bucket{arm="b",endpoint="/v1/predict"' in text
    assert 'balanceroute_batch_size_count{endpoint="/v1/predict"}' in text
    assert 'balanceroute_model_info{arm="a"' in text and 'kind="gbdt"' in text
    assert 'balanceroute_reloads_total{arm="a",outcome="changed"} 1.0' in text


def test_probes(module_server: Server) -> None:
    with module_server.client() as c:
        assert c.get("/healthz").json()["status"] == "ok"
        assert c.get("/readyz").json()["status"] == "ready"

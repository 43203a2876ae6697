"""The bearer token, and a server whose model cannot load (probes, 503s, routing fallback)."""

from __future__ import annotations

import re
import time
from pathlib import Path

import joblib
import pytest

from tests.serving.service.helpers import TOKEN, Server, post

pytestmark = pytest.mark.server
SERVER_ARMS = ("survival", None)
SERVER_ENV = {"BALANCEROUTE_API_TOKEN": TOKEN, "BALANCEROUTE_WARM_ROUTER": "false"}

ROWS = [{"id": 1, "prompt_tokens": 10, "age": 1}]
PROTECTED = [
    ("POST", "/v1/predict", {"requests": ROWS}),
    ("POST", "/v1/observe", {"completions": [{"prompt_tokens": 10, "output_tokens": 3}]}),
    ("POST", "/v1/route", {"policy": "br0", "workers": [{"free_slots": 1}], "pool": []}),
    ("GET", "/v1/models", None),
    ("GET", "/metrics", None),
    ("POST", "/v1/admin/reload", {}),
]


@pytest.mark.parametrize(("method", "path", "body"), PROTECTED)
def test_every_endpoint_but_the_probes_needs_the_token(
    module_server: Server, method: str, path: str, body
) -> None:
    for token in (None, "wrong-token-0123456789", TOKEN[:-1]):
        with module_server.client(token) as c:
            resp = c.request(method, path, json=body)
        assert resp.status_code == 401, (path, token)
        assert resp.headers["www-authenticate"] == "Bearer"
    with module_server.client(TOKEN) as c:
        assert c.request(method, path, json=body).status_code == 200


def test_a_bad_body_without_the_token_is_still_401(module_server: Server) -> None:
    with module_server.client() as c:
        assert c.post("/v1/predict", content=b"{oops").status_code == 401


def test_probes_are_open(module_server: Server) -> None:
    with module_server.client() as c:
        assert c.get("/healthz").status_code == 200
        assert c.get("/readyz").status_code == 200


def test_a_model_that_cannot_load_keeps_the_process_up(start_server, tmp_path: Path) -> None:
    bad = tmp_path / "bad.joblib"
    joblib.dump({"not": "an estimator"}, bad)
    server = start_server(str(bad), ready=False)
    route = {
        "policy": "brh",
        "workers": [{"free_slots": 1, "running": [{"id": 1, "prompt_tokens": 5, "age": 2}]}],
        "pool": [{"id": "w", "prompt_tokens": 7}],
    }
    with server.client() as c:
        ready = c.get("/readyz")
        deadline = time.monotonic() + 60
        while ready.json()["status"] != "failed" and time.monotonic() < deadline:
            time.sleep(0.1)
            ready = c.get("/readyz")
        predict = post(c, "/v1/predict", {"requests": ROWS})
        routed = post(c, "/v1/route", route)
        models = c.get("/v1/models").json()
        metrics = c.get("/metrics").text
    assert ready.status_code == 503 and ready.json()["status"] == "failed"
    assert "does not hold a completion estimator" in ready.json()["detail"]
    assert predict.status_code == 503 and "failed to load" in predict.json()["detail"]
    assert routed.status_code == 200
    assert routed.json()["admissions"] == [{"id": "w", "worker": 0}]
    assert "failed to load" in routed.json()["fallback"]
    assert routed.json()["policy"]["estimator"] == "none"
    assert models["arms"] == []
    assert (
        'balanceroute_fallbacks_total{endpoint="/v1/route",reason="model_unavailable"} 1.0'
        in metrics
    )
    # the failed load is retried with back-off (1 s, 2 s, ...): a slow machine may count more
    failed_loads = re.search(r'balanceroute_reloads_total\{arm="a",outcome="error"\} (\S+)', metrics)
    assert failed_loads is not None and float(failed_loads.group(1)) >= 1.0

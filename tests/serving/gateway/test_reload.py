"""``POST /admin/reload`` goes through the one model lifecycle: the new model has learned the
completions the gateway saw, and one that fails to load or its health check is not swapped in and
the answer is not 2xx."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from balanceroute.predict.base import CompletedBatch
from balanceroute.predict.model_store import load_file
from balanceroute.serving.gateway.arms import fan_out
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.lifecycle import renew as renew_module
from tests.serving.lifecycle.test_renew import UNSEEN_KEY, c_of_the_key

TOKEN = "s3cret-token-of-24-chars"
AUTH = {"authorization": f"Bearer {TOKEN}"}


def test_gateway_reload_replays_and_refuses_what_fails(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fastapi.testclient import TestClient

    from balanceroute.serving.gateway.app import create_gateway_app
    from balanceroute.serving.gateway.runtime import build_gateway

    live = tmp_path / "live.joblib"
    shutil.copy(model_dir / "exactmatch.joblib", live)
    settings = GatewaySettings(ranks=["http://127.0.0.1:9"], slots=2, router="brh",
                               estimator=f"exactmatch@{live}", api_token=TOKEN)  # fmt: skip
    gateway = build_gateway(settings)
    [arm] = gateway.arms
    assert arm.handle is not None and arm.version
    with TestClient(create_gateway_app(gateway), base_url="http://127.0.0.1") as client:
        n = 300
        seen = CompletedBatch(np.full(n, 100), np.full(n, 1500),
                              np.full(n, UNSEEN_KEY, dtype=np.uint64), np.zeros(n))  # fmt: skip
        fan_out(gateway.arms, seen, gateway.recent)  # what every finished request goes through
        first = arm.handle.model
        ok = client.post("/admin/reload", headers=AUTH)
        assert ok.status_code == 200
        [row] = ok.json()["results"]
        assert row["status"] == "swapped" and row["version"] == arm.version, row
        renewed = arm.handle.model
        assert renewed is not first
        as_loaded = c_of_the_key(load_file(live))
        assert not np.allclose(c_of_the_key(renewed), as_loaded)  # it learned the completions

        monkeypatch.setattr(renew_module, "health_problem", lambda est: "answers nonsense")
        unhealthy = client.post("/admin/reload", headers=AUTH)
        monkeypatch.undo()
        live.write_bytes(b"not a pickle")
        broken = client.post("/admin/reload", headers=AUTH)
        for resp, words in ((unhealthy, "health check"), (broken, "live.joblib")):
            assert resp.status_code == 502
            [row] = resp.json()["results"]
            assert row["status"] == "failed" and words in row["detail"], row
        assert arm.handle.model is renewed  # the old model keeps serving
        metrics = client.get("/metrics", headers=AUTH).text
        assert 'balanceroute_gateway_reloads_total{outcome="failed"} 2.0' in metrics

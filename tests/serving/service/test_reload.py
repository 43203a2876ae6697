"""``POST /v1/admin/reload``: a new version swaps in while a client keeps calling, none fails."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from tests.serving.service.helpers import post

pytestmark = pytest.mark.server
ROWS = [{"id": j, "prompt_tokens": 300 + j, "age": j} for j in range(64)]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:12]


class Hammer:
    """A client calling ``/v1/predict`` in a loop, recording the version of every answer."""

    def __init__(self, url: str) -> None:
        import httpx

        self.client = httpx.Client(base_url=url, timeout=30.0, trust_env=False)
        self.versions: list[str] = []
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run)
        self.thread.start()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                resp = post(self.client, "/v1/predict", {"requests": ROWS})
                if resp.status_code != 200:
                    self.failures.append(f"{resp.status_code}: {resp.text}")
                else:
                    self.versions.append(resp.json()["model"]["version"])
            except Exception as exc:
                self.failures.append(repr(exc))

    def wait_calls(self, n: int) -> None:
        target = len(self.versions) + n
        while len(self.versions) < target and not self.failures:
            self.stop.wait(0.01)

    def finish(self) -> None:
        self.stop.set()
        self.thread.join()
        self.client.close()


def test_reload_swaps_a_changed_file_without_failing_a_call(
    start_server, model_dir: Path, tmp_path: Path
) -> None:
    live = tmp_path / "live.joblib"
    shutil.copy(model_dir / "survival.joblib", live)
    old = _digest(live)
    server = start_server(str(live))
    hammer = Hammer(server.url)
    try:
        hammer.wait_calls(20)
        with server.client() as c:
            same_resp = c.post("/v1/admin/reload")
            same = same_resp.json()["arms"]
            live.write_bytes(b"not a pickle")
            broken_resp = post(c, "/v1/admin/reload", {"arm": "a"})
            broken = broken_resp.json()["arms"][0]
            hammer.wait_calls(10)
            staged = tmp_path / "staged.joblib"
            shutil.copy(model_dir / "exactmatch.joblib", staged)
            os.replace(staged, live)
            swapped_resp = post(c, "/v1/admin/reload", {"slot": "a"})  # the new name
            swapped = swapped_resp.json()["arms"]
            hammer.wait_calls(20)
            kind = c.get("/v1/models").json()["arms"][0]["kind"]
            ready = c.get("/readyz").status_code
    finally:
        hammer.finish()
    new = _digest(live)
    assert same == [
        {"arm": "a", "previous_version": old, "version": old, "changed": False, "error": None}
    ]
    assert broken["changed"] is False and broken["version"] == old and broken["error"]
    assert (same_resp.status_code, broken_resp.status_code, swapped_resp.status_code) == (
        200,
        502,  # a failed reload answers non-2xx, the old model serving on
        200,
    )
    assert swapped == [
        {"arm": "a", "previous_version": old, "version": new, "changed": True, "error": None}
    ]
    assert hammer.failures == []
    first_new = hammer.versions.index(new)
    assert set(hammer.versions[:first_new]) == {old}
    assert set(hammer.versions[first_new:]) == {new}
    assert kind == "exactmatch" and ready == 200


def _train(tmp_path: Path) -> dict[str, str]:
    """``balanceroute train`` of survival and exactmatch into a fresh SQLite registry."""
    env = {
        **os.environ,
        "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "MLFLOW_DISABLE_TELEMETRY": "true",
    }
    args = [
        sys.executable,
        "-m",
        "balanceroute.cli",
        "train",
        "--requests",
        "600",
        "--estimators",
        "survival,exactmatch",
        "--out",
        str(tmp_path / "art"),
    ]
    done = subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return {"MLFLOW_TRACKING_URI": env["MLFLOW_TRACKING_URI"]}


@pytest.mark.slow
def test_registry_aliases_resolve_and_reload_follows_the_alias(start_server, tmp_path) -> None:
    pytest.importorskip("mlflow")
    env = _train(tmp_path)
    server = start_server(
        "models:/completion-predictor@survival",
        "models:/completion-predictor@exactmatch",
        env=env,
    )
    with server.client() as c:
        arms = {a["arm"]: a for a in c.get("/v1/models").json()["arms"]}
        assert arms["a"]["kind"] == "survival" and arms["b"]["kind"] == "exactmatch"
        assert arms["a"]["source"] == "mlflow" and "survival" in arms["a"]["aliases"]
        assert "brier" in arms["a"]["metrics"] and arms["a"]["run_id"]
        by_alias = post(c, "/v1/predict", {"requests": ROWS, "model": "exactmatch"}).json()
        assert by_alias["model"]["arm"] == "b"
        from mlflow.tracking import MlflowClient

        registry = MlflowClient(env["MLFLOW_TRACKING_URI"])
        registry.set_registered_model_alias(
            "completion-predictor", "survival", arms["b"]["version"]
        )
        out = post(c, "/v1/admin/reload", {"arm": "a"}).json()["arms"][0]
        answer = post(c, "/v1/predict", {"requests": ROWS, "model": "a"}).json()["model"]
    assert out["changed"] and out["version"] == arms["b"]["version"]
    assert answer["kind"] == "exactmatch" and answer["version"] == arms["b"]["version"]

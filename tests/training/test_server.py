"""train + evaluate against a real ``mlflow server`` process on 127.0.0.1 (started and stopped here)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

from balanceroute.predict.model_store import load_estimator
from tests.training.conftest import PRESET_ARGS, free_port, run_cli

pytestmark = pytest.mark.server


@pytest.fixture
def mlflow_server(tmp_path):
    """An MLflow tracking server with a SQLite store and proxied artifacts; yields its URI."""
    port = free_port()
    env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination", str(tmp_path / "server-artifacts"),
    ]  # fmt: skip
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    uri = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{uri}/health", timeout=2) as resp:
                    if resp.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(
                    f"mlflow server did not start: {(tmp_path / 'server.log').read_text()[-2000:]}"
                )
            time.sleep(0.5)
        yield uri
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def test_train_and_evaluate_against_server(mlflow_server, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    args = [
        "train",
        *PRESET_ARGS,
        "--estimators",
        "survival,exactmatch",
        "--register-as",
        "cp-server",
    ]
    assert run_cli(args) == 0
    assert not (tmp_path / "mlflow.db").exists()  # everything went to the server
    client = MlflowClient(tracking_uri=mlflow_server)
    model = client.get_registered_model("cp-server")
    assert {"survival", "exactmatch", "champion", "challenger"} <= set(model.aliases)
    assert load_estimator("exactmatch", model_name="cp-server").name == "exactmatch"
    out = tmp_path / "eval"
    code = run_cli(
        [
            "evaluate",
            *PRESET_ARGS,
            "--estimator",
            "exactmatch",
            "--model-name",
            "cp-server",
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert "exactmatch" in json.loads((out / "metrics.json").read_text())

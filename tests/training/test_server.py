"""train + evaluate against a real ``mlflow server`` process on 127.0.0.1 (started and stopped here)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from balanceroute.predict.model_store import load_estimator
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port
from tests.training.conftest import PRESET_ARGS, run_cli

pytestmark = pytest.mark.server


@pytest.fixture
def mlflow_server(tmp_path):
    """An MLflow tracking server with a SQLite store and proxied artifacts; yields its URI."""
    port = free_port()
    env = clean_env({"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--host", "127.0.0.1",
        "--port", str(port),
        "--workers", "1",
        "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}",
        "--artifacts-destination", str(tmp_path / "server-artifacts"),
    ]  # fmt: skip
    uri = f"http://127.0.0.1:{port}"
    server = ServerProcess(cmd, log=tmp_path / "server.log", env=env, cwd=tmp_path, group=True)
    try:
        server.wait_ready([f"{uri}/health"], timeout_s=90, poll_s=0.5)
        yield uri
    finally:
        server.terminate(timeout_s=20)


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

"""Promotion: ``champion`` moves only for a candidate that beats it on the same holdout (or on
``--promote``), aliases move only after a successful run, orphaned runs are closed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import mlflow
from mlflow import MlflowClient

from balanceroute.training.champion import Champion, promotion
from balanceroute.training.train import HOST_TAG, PID_TAG, close_orphaned_runs
from tests.training.conftest import run_cli

MODEL = "completion-predictor"
ARGS = ["--preset", "azure-conv", "--requests", "600", "--seed", "2", "--experiment", "promo"]


def _aliases() -> dict[str, str]:
    return dict(MlflowClient().get_registered_model(MODEL).aliases)


def test_promotion_rule() -> None:
    m = {"survival": {"brier": 0.20}, "exactmatch": {"brier": 0.15}}
    assert promotion(m, Champion(), False)[:2] == ("exactmatch", True)
    assert promotion(m, Champion("3", "gbdt", 0.10), False)[:2] == ("exactmatch", False)
    assert promotion(m, Champion("3", "gbdt", 0.18), False)[:2] == ("exactmatch", True)
    assert promotion(m, Champion("3", "gbdt", 0.10), True)[:2] == ("exactmatch", True)
    unscored = Champion("3", note="the champion cannot be loaded")
    assert promotion(m, unscored, False)[1] is False


def test_a_worse_model_does_not_move_champion(isolated, monkeypatch) -> None:
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")
    assert run_cli(["train", *ARGS, "--estimators", "exactmatch"]) == 0
    first = _aliases()
    assert first["champion"] == first["exactmatch"]

    # survival alone (no per-key signal) scores worse on this holdout than the champion
    assert run_cli(["train", *ARGS, "--estimators", "survival"]) == 0
    second = _aliases()
    assert second["champion"] == first["champion"]
    assert second["challenger"] == second["survival"]

    # a failed run (the registry write breaks mid-way) moves no alias at all
    def broken(*args, **kwargs):
        raise RuntimeError("registry write failed")

    with monkeypatch.context() as patched:  # undoes only this patch, not the fixture's chdir
        patched.setattr(mlflow.pyfunc, "log_model", broken)
        assert run_cli(["train", *ARGS, "--estimators", "exactmatch", "--promote"]) == 3
    assert _aliases() == second
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")

    # an explicit --promote moves it
    assert run_cli(["train", *ARGS, "--estimators", "survival", "--promote"]) == 0
    third = _aliases()
    assert third["champion"] == third["survival"] != second["champion"]


def test_runs_of_dead_processes_are_closed(isolated) -> None:
    """A run whose process was killed (-9) stays RUNNING; the next train closes it."""
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")
    client = MlflowClient()
    exp = client.create_experiment("orphans")
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    host = socket.gethostname()
    orphan = client.create_run(exp, tags={PID_TAG: dead, HOST_TAG: host}).info.run_id
    alive = client.create_run(exp, tags={PID_TAG: str(os.getpid()), HOST_TAG: host}).info.run_id
    assert client.get_run(orphan).info.status == "RUNNING"
    assert close_orphaned_runs(client, "orphans") == [orphan]
    assert client.get_run(orphan).info.status == "KILLED"
    assert client.get_run(alive).info.status == "RUNNING"
    assert close_orphaned_runs(client, "orphans") == []

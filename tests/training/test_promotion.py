"""Promotion: ``champion`` moves only for a candidate that beats it on the same holdout (or on
``--promote``), aliases move only after a successful run, orphaned runs are closed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import mlflow
import numpy as np
from mlflow import MlflowClient

from balanceroute.features.synthetic import generate
from balanceroute.training.champion import Champion, Paired, promotion
from balanceroute.training.holdout import make_holdout
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


def test_with_both_models_predictions_a_lower_brier_must_be_resolved_by_the_paired_interval():
    holdout = make_holdout(generate("azure-conv", 600, seed=1), 0.7, 0)
    y = (holdout.remaining <= 80).astype(np.float64)
    rng = np.random.default_rng(0)
    champion_p = np.full(y.size, 0.5)

    def nudged(right: float) -> np.ndarray:
        """0.5 moved 0.1 toward the outcome with probability ``right``, else away from it."""
        toward = np.where(rng.random(y.size) < right, 1.0, -1.0)
        return 0.5 + 0.1 * toward * (2 * y - 1)

    def brier(p: np.ndarray) -> float:
        return float(np.mean((p - y) ** 2))

    clear, marginal = nudged(0.9), nudged(0.56)
    assert brier(clear) < brier(marginal) < brier(champion_p)  # both lower at the point
    paired = Paired({"gbdt": clear, "survival": marginal}, holdout, 80)
    champion = Champion("3", "gbdt", brier(champion_p), p_finish=champion_p)
    kind, better, why = promotion({"gbdt": {"brier": brier(clear)}}, champion, False, paired)
    assert (kind, better) == ("gbdt", True) and "better (difference -" in why
    noisy = {"survival": {"brier": brier(marginal)}}
    kind, better, why = promotion(noisy, champion, False, paired)
    assert (kind, better) == ("survival", False) and "the interval reaches 0" in why
    worse = Champion("3", "gbdt", brier(clear), p_finish=clear)
    assert "worse)" in promotion(noisy, worse, False, paired)[2]
    assert promotion(noisy, champion, False)[1] is True  # the point rule alone would promote it
    gain = paired.gain("survival", champion_p)
    assert gain is not None and gain.low < 0 < gain.high and gain.requests == y.size // 3


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

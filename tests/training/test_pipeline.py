"""train + evaluate end to end against a SQLite store: registry, aliases, pyfunc, bad input."""

from __future__ import annotations

import json
import os
from pathlib import Path

import mlflow
import numpy as np
import pandas as pd
import pytest
from mlflow import MlflowClient

from balanceroute.predict.base import CompletionEstimator, RunningBatch
from balanceroute.predict.model_store import load_estimator, load_file
from balanceroute.serving.testbed.harness import free_port
from balanceroute.training.train import TrainConfig, estimator_spec
from tests.training.conftest import PRESET_ARGS, run_cli

MODEL = "completion-predictor"


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """One training run of the three default estimators in a fresh folder (``hazard`` left out:
    its fits cost two thirds of the module's time; tests/predict and
    tests/serving/service/test_hazard.py fit and serve it)."""
    root = tmp_path_factory.mktemp("train")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        kinds = "survival,exactmatch,gbdt"
        code = run_cli(
            [
                "train",
                *PRESET_ARGS,
                "--experiment",
                "pipeline-test",
                "--estimators",
                kinds,
                "--no-twin-prior",
            ]  # the prior has its own tests (test_twin_prior_train.py)
        )
        yield root, code


@pytest.fixture
def in_trained(trained, monkeypatch):
    root, code = trained
    monkeypatch.chdir(root)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    return root, code


def test_train_registers_versions_and_aliases(in_trained):
    root, code = in_trained
    assert code == 0
    assert (root / "mlflow.db").is_file()
    client = MlflowClient()
    versions = client.search_model_versions(f"name='{MODEL}'")
    kinds = {v.tags["kind"]: v.version for v in versions}
    assert set(kinds) == {"survival", "exactmatch", "gbdt"}
    aliases = client.get_registered_model(MODEL).aliases
    for kind, version in kinds.items():
        assert aliases[kind] == version
    briers = {v.tags["kind"]: float(v.tags["val_brier"]) for v in versions}
    assert aliases["champion"] == kinds[min(briers, key=briers.get)]
    run = client.get_run(versions[0].run_id)
    assert run.info.status == "FINISHED"
    assert run.data.params["trace_rows"] == "900" and len(run.data.params["trace_sha256"]) == 64
    assert "gbdt.brier" in run.data.metrics
    names = {a.path for a in client.list_artifacts(run.info.run_id, "evaluation")}
    assert {"evaluation/reliability.png", "evaluation/brier_by_age.png"} <= names
    local = list((root / "artifacts" / "models").glob("*/gbdt.joblib"))
    assert len(local) == 1


def test_pyfunc_loads_and_unwraps(in_trained):
    model = mlflow.pyfunc.load_model(f"models:/{MODEL}@champion")
    frame = pd.DataFrame({"prompt_tokens": [100, 900], "age": [0, 30], "prompt_key": ["x", None]})
    out = model.predict(frame)
    assert list(out.columns) == ["p_finish", "c"]
    est = load_estimator("champion")
    assert isinstance(est, CompletionEstimator)
    native = est.predict(RunningBatch(np.array([100, 900]), np.array([0, 30])))
    np.testing.assert_allclose(out["c"].to_numpy(), native.c)
    assert load_estimator("survival").name == "survival"


def test_evaluate_by_alias_and_by_file(in_trained, capsys):
    root, _ = in_trained
    out = root / "eval"
    args = ["evaluate", *PRESET_ARGS, "--estimator", "survival,gbdt", "--out", str(out)]
    code = run_cli([*args, "--max-states", "40"])
    assert code == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics) == {"survival", "gbdt"}
    decision = ("ibs_discounted", "brier_at_8", "auc_at_16", "proj_error", "proj_error_margin")
    for m in metrics.values():
        for name in ("auc", "brier", "log_loss", "ece", "c_mae", "predictions_per_s", "by_age"):
            assert name in m
        for name in decision:
            assert np.isfinite(m[name]), name
    rec = json.loads((out / "recommendation.json").read_text())
    assert rec["pick"] in {"none", "survival", "gbdt"}
    assert set(rec["scores"]) == {"none", "survival", "gbdt"}
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1].startswith(f"recommendation: {rec['pick']}")
    rows = {line.split()[0] for line in printed if line.strip()}
    assert set(decision) <= rows  # the metrics table shows the new scores
    assert (out / "reliability.png").is_file() and (out / "brier_by_age.png").is_file()
    # the file-based path gives the same scores as the alias for the same model
    joblib_file = next((root / "artifacts" / "models").glob("*/survival.joblib"))
    out2 = root / "eval2"
    assert (
        run_cli(["evaluate", *PRESET_ARGS, "--model-uri", str(joblib_file), "--out", str(out2)])
        == 0
    )
    m2 = json.loads((out2 / "metrics.json").read_text())
    assert m2["survival"]["brier"] == pytest.approx(metrics["survival"]["brier"])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["train", *PRESET_ARGS, "--estimators", "survival,magic"], "unknown estimator"),
        (["train", "--preset", "azure-conv", "--requests", "30"], "too short"),
        (
            ["evaluate", *PRESET_ARGS, "--model-uri", "models:/nope@champion", "--out", "x"],
            "does not resolve",
        ),
        (["evaluate", *PRESET_ARGS, "--model-uri", "missing.joblib", "--out", "x"], "not found"),
    ],
)
def test_bad_input_exits_cleanly(isolated, capsys, args, message):
    assert run_cli(args) == 2
    assert message in capsys.readouterr().err
    _assert_no_finished_runs(isolated)


def test_unknown_key_is_refused(isolated, capsys):
    assert run_cli(["train", *PRESET_ARGS, "--key", "colour"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_unknown_weighting_is_refused(isolated, capsys):
    assert run_cli(["train", *PRESET_ARGS, "--weighting", "uniform"]) == 2
    assert "invalid choice" in capsys.readouterr().err


def test_weighting_reaches_the_learned_estimators_only():
    """``train --weighting`` sets the option of the estimators that have it, and leaves every
    estimator its own default when not given."""
    cfg = TrainConfig(weighting="request")
    assert estimator_spec(cfg, "hazard").params["weighting"] == "request"
    assert estimator_spec(cfg, "gbdt").params["weighting"] == "request"
    assert "weighting" not in estimator_spec(cfg, "survival").params
    assert "weighting" not in estimator_spec(TrainConfig(), "hazard").params


@pytest.mark.parametrize(("outputs", "message"), [([5] * 300, "same output length"), (None, "row")])
def test_bad_trace_files(isolated, capsys, outputs, message):
    n = 300
    frame = pd.DataFrame(
        {
            "request_id": np.arange(n),
            "arrival_s": np.arange(n, dtype=float),
            "prompt_tokens": np.full(n, 100),
            "output_tokens": outputs if outputs is not None else np.arange(n) + 1.0,
            "prompt_key": ["k"] * n,
        }
    )
    if outputs is None:
        frame.loc[17, "output_tokens"] = np.nan
    path = isolated / "trace.csv"
    frame.to_csv(path, index=False)
    assert run_cli(["train", "--trace", str(path), "--estimators", "survival"]) == 2
    assert message in capsys.readouterr().err
    _assert_no_finished_runs(isolated)


def test_failure_while_logging_marks_run_failed(isolated, capsys, monkeypatch):
    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(mlflow.pyfunc, "log_model", boom)
    assert run_cli(["train", *PRESET_ARGS, "--estimators", "survival"]) == 3
    err = capsys.readouterr().err
    assert "disk full" in err and "saved locally in" in err
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True)
    assert set(runs["status"]) == {"FAILED"}


def test_tracking_down_keeps_local_artifacts(isolated, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"http://127.0.0.1:{free_port()}")
    out = isolated / "kept"
    code = run_cli(
        ["train", *PRESET_ARGS, "--estimators", "survival,exactmatch", "--out", str(out)]
    )
    assert code == 3
    err = capsys.readouterr().err
    assert f"saved locally in {out.resolve()}" in err
    for name in ("survival.joblib", "exactmatch.joblib", "metrics.json", "config.json"):
        assert (out / name).is_file()
    assert load_file(out / "exactmatch.joblib").name == "exactmatch"


def _assert_no_finished_runs(root: Path) -> None:
    db = root / "mlflow.db"
    if not db.exists():
        return
    mlflow.set_tracking_uri(f"sqlite:///{db}")
    runs = mlflow.search_runs(search_all_experiments=True)
    assert runs.empty or "FINISHED" not in set(runs["status"])
    os.environ.pop("MLFLOW_TRACKING_URI", None)

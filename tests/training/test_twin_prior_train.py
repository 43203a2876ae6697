"""``train`` registers models fitted on the whole history with the twin's prior cross-fitted on
it (every fold replayed by a copy that never saw it), and the prior travels with the model:
artifact, metrics and version tags in a real SQLite store, and the loaded model."""

from __future__ import annotations

import copy
import json

import mlflow
import pandas as pd
import pytest
from mlflow import MlflowClient

from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import load_estimator
from balanceroute.router.lab.twin.prior import PRIOR_ATTRIBUTE, PriorConfig, TwinPrior, twin_prior
from balanceroute.router.lab.twin.prior_measure import measure_folds
from balanceroute.training.crossfit import fitted_folds, time_folds
from balanceroute.training.holdout import make_holdout
from tests.training.conftest import PRESET_ARGS, run_cli

MODEL = "prior-model"
SHAPE = PriorConfig(workers=2, slots=4, windows=4)  # blocks of 128 requests


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("prior")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        code = run_cli(
            [
                "train",
                *PRESET_ARGS,
                "--experiment",
                "prior-test",
                "--register-as",
                MODEL,
                "--estimators",
                "survival,exactmatch",
                "--twin-group",
                "2x4",
                "--twin-windows",
                "4",
            ]
        )
        mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
        yield root, code


def _holdout():
    kind, n, seed = PRESET_ARGS[1], int(PRESET_ARGS[3]), int(PRESET_ARGS[5])
    frame, _ = load_workload(WorkloadSpec(preset=kind, requests=n, seed=seed))
    return make_holdout(frame, 0.7, seed)


def test_the_prior_round_trips_through_mlflow(trained, monkeypatch):
    root, code = trained
    assert code == 0
    monkeypatch.chdir(root)
    client = MlflowClient()
    for kind in ("survival", "exactmatch"):
        uri = f"models:/{MODEL}@{kind}"
        prior = twin_prior(uri, 2, 4)
        assert prior is not None and prior.windows == 4 and prior.group == "2x4 saturated"
        version = client.get_model_version_by_alias(MODEL, kind)
        assert version.tags["twin_prior.2x4.start_weight"] == f"{prior.start_weight:g}"
        assert version.tags["twin_prior.2x4.upper"].count(",") == 2
        run = client.get_run(version.run_id)
        assert run.data.metrics[f"{kind}.twin_prior.2x4.weight"] == prior.start_weight
        logged = mlflow.artifacts.load_dict(f"runs:/{version.run_id}/twin_prior/{kind}.json")
        assert [TwinPrior.from_dict(d) for d in logged] == [prior]
        local = list((root / "artifacts" / "models").glob(f"*/{kind}.joblib"))
        assert twin_prior(str(local[0])) == prior  # the local file carries it too


def test_the_registered_model_sees_all_and_its_prior_is_cross_fitted(trained, monkeypatch):
    root, _ = trained
    monkeypatch.chdir(root)
    holdout = _holdout()
    history = pd.concat([holdout.train, holdout.test], ignore_index=True)
    est = load_estimator(f"models:/{MODEL}@exactmatch")
    prior = twin_prior(est, 2, 4)
    # the evidence covers the whole history, in two folds
    assert prior.folds == 2 and prior.holdout_requests == len(history)
    assert prior.holdout_first_arrival_s == history["arrival_s"].min()
    assert prior.holdout_last_arrival_s == history["arrival_s"].max()
    summary = json.loads(next((root / "artifacts" / "models").glob("*/config.json")).read_text())
    assert summary["n_registered"] == len(history) > summary["n_train"]
    # it is the evidence of copies fitted on the other fold, each replaying the fold it never saw
    spec = EstimatorSpec("exactmatch", params={"horizon": est.horizon})
    pairs = fitted_folds(lambda part: build_estimator(spec, history=part), time_folds(history, 2))
    assert measure_folds(pairs, SHAPE) == prior
    # the registered model saw every fold: had train measured the prior with it, the evidence
    # would differ (exactmatch memorises outputs by key)
    delattr(est, PRIOR_ATTRIBUTE)
    leaked = [(copy.deepcopy(est), replay) for _, replay in pairs]
    assert measure_folds(leaked, SHAPE).mean_log_ratio != prior.mean_log_ratio


def test_no_twin_prior_keeps_none(isolated):
    args = ["train", *PRESET_ARGS, "--estimators", "survival", "--no-twin-prior"]
    assert run_cli([*args, "--experiment", "none", "--register-as", "bare"]) == 0
    assert twin_prior("models:/bare@survival") is None
    assert run_cli([*args[:-1], "--twin-group", "8by32"]) == 2

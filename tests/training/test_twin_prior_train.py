"""``train`` measures the twin's prior on the holdout only and it travels with the registered
model: artifact, metrics and version tags in a real SQLite store, and the loaded model."""

from __future__ import annotations

import copy

import mlflow
import pytest
from mlflow import MlflowClient

from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.model_store import load_estimator
from balanceroute.router.lab.twin_prior import (
    PRIOR_ATTRIBUTE,
    PriorConfig,
    TwinPrior,
    measure_prior,
    twin_prior,
)
from balanceroute.training.evaluate import evaluate_estimator
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


def test_the_prior_is_measured_on_the_holdout_by_the_model_that_never_saw_it(trained, monkeypatch):
    root, _ = trained
    monkeypatch.chdir(root)
    holdout = _holdout()
    est = load_estimator(f"models:/{MODEL}@exactmatch")
    prior = twin_prior(est, 2, 4)
    assert prior.holdout_requests == len(holdout.test)
    assert prior.holdout_first_arrival_s == holdout.test["arrival_s"].min()
    assert prior.holdout_first_arrival_s > holdout.train["arrival_s"].max()
    delattr(est, PRIOR_ATTRIBUTE)
    again = measure_prior(copy.deepcopy(est), holdout.test, SHAPE)
    assert again == prior
    # the model as scored (it observed the holdout while evaluated) would give other evidence:
    # had train measured the prior with it, the equality above would fail
    evaluate_estimator(est, holdout, est.horizon)
    assert measure_prior(est, holdout.test, SHAPE).mean_log_ratio != prior.mean_log_ratio


def test_no_twin_prior_keeps_none(isolated):
    args = ["train", *PRESET_ARGS, "--estimators", "survival", "--no-twin-prior"]
    assert run_cli([*args, "--experiment", "none", "--register-as", "bare"]) == 0
    assert twin_prior("models:/bare@survival") is None
    assert run_cli([*args[:-1], "--twin-group", "8by32"]) == 2

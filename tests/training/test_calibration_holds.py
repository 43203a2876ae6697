"""Calibration that holds: every learned estimator, registered as ``train`` registers it (fitted
on the whole trace) and scored as ``evaluate`` scores it (the time-ordered holdout, by a copy
that never saw it), is calibrated on both shared traces; and an evaluation never scores a model
on requests it was fitted on.

Each model is held to the population its rows are weighted for: ``weighting = request``
(``gbdt``'s default) to every request alike (``ece``), ``time-at-risk`` (``hazard``'s) to the
running requests a router meets (``ece_at_risk``: the holdout's snapshots, at uniform ages of
each request, weighted by the request's length). ``hazard`` is not calibrated per request on
Mooncake (``ece`` 0.18) by design, as ``gbdt`` is not by time at risk (0.12).
"""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.features.digest import request_fingerprints, seen_requests
from balanceroute.features.synthetic import generate
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.learned import LearnedEstimator
from balanceroute.predict.registry import ESTIMATORS
from balanceroute.training.evaluate import evaluate_estimator, unseen_holdout
from balanceroute.training.holdout import make_holdout
from balanceroute.training.train import TrainConfig, estimator_spec
from tests.shared_data import shared_data_dir

SHARED_DATA = shared_data_dir()
TRACES = {"azure": "azure_llm_2023_conv.csv", "mooncake": "mooncake_conversation.jsonl"}
LEARNED = sorted(n for n, cls in ESTIMATORS.items() if issubclass(cls, LearnedEstimator))
ECE_BOUND = 0.02  # issue 33's target for gbdt, on the whole trace trained and scored as above


def own_ece(metrics: dict[str, float], weighting: str) -> float:
    """The calibration error on the population the model's rows are weighted for."""
    return metrics["ece_at_risk" if weighting == "time-at-risk" else "ece"]


@pytest.fixture(scope="module")
def small_trace_frame():
    """600 synthetic requests with prompt keys."""
    return generate("mooncake-conv", 600, seed=3)


def test_the_learned_estimators_are_found():
    assert {"gbdt", "hazard"} <= set(LEARNED)


@pytest.mark.slow
@pytest.mark.parametrize("name", LEARNED)
@pytest.mark.parametrize("trace", sorted(TRACES))
def test_registered_model_scored_by_evaluate_is_calibrated(name, trace):
    path = SHARED_DATA / TRACES[trace]
    if not path.is_file():
        pytest.skip(f"shared trace {path} not found (the shared traces live beside the repository)")
    frame, _ = load_workload(WorkloadSpec(trace=str(path)))
    holdout = make_holdout(frame, TrainConfig().train_fraction, 0)
    # what evaluate scores for the model train registers (fitted on the whole trace): a copy
    # with its parameters fitted on the training part (unseen_holdout, tested below on a
    # small trace); fitting it here directly saves the whole-trace fit
    scored = build_estimator(estimator_spec(TrainConfig(), name), history=holdout.train)
    assert unseen_holdout(scored, holdout) is scored
    metrics, _ = evaluate_estimator(scored, holdout, scored.horizon)
    ece = own_ece(metrics, scored.weighting)
    assert ece <= ECE_BOUND, f"{name} ({scored.weighting}) on {trace}: ECE {ece:.4f}"


def test_unseen_holdout_refits_only_a_model_that_saw_the_holdout(small_trace_frame):
    holdout = make_holdout(small_trace_frame, 0.7, 0)
    spec = EstimatorSpec("survival", params={"horizon": 16, "window": 500})
    on_train = build_estimator(spec, history=holdout.train)
    assert unseen_holdout(on_train, holdout) is on_train
    on_all = build_estimator(spec, history=small_trace_frame)
    again = unseen_holdout(on_all, holdout)
    assert again is not on_all and again.params() == on_all.params()
    assert seen_requests(again.fitted_requests_, holdout.test) == 0


def test_fingerprints_count_shared_requests(small_trace_frame):
    head, tail = small_trace_frame.iloc[:100], small_trace_frame.iloc[50:150]
    assert seen_requests(request_fingerprints(head), tail) == 50
    assert seen_requests(None, tail) == 0
    assert request_fingerprints(head).dtype == np.uint64


def test_own_ece_reads_the_weighting():
    m = {"ece": 0.1, "ece_at_risk": 0.01}
    assert own_ece(m, "time-at-risk") == 0.01
    assert own_ece(m, "request") == 0.1

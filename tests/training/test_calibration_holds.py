"""Calibration that holds: every learned estimator, registered as ``train`` registers it (fitted
on the whole trace) and scored as ``evaluate`` scores it (the time-ordered holdout), is
calibrated on both shared traces; and an evaluation never scores a model on requests it was
fitted on."""

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
from tests.shared_data import shared_data_dir

SHARED_DATA = shared_data_dir()
TRACES = {"azure": "azure_llm_2023_conv.csv", "mooncake": "mooncake_conversation.jsonl"}
LEARNED = sorted(n for n, cls in ESTIMATORS.items() if issubclass(cls, LearnedEstimator))
REQUESTS = 4000  # the first requests of each trace: enough for a stable ECE, cheap to fit
ECE_BOUND = 0.03  # the target on the whole trace is 0.02; a 4,000-request holdout is noisier


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
    frame, _ = load_workload(WorkloadSpec(trace=str(path), requests=REQUESTS))
    params = {"num_threads": 1}
    registered = build_estimator(EstimatorSpec(name, params=params), history=frame)
    holdout = make_holdout(frame, 0.7, 0)
    scored = unseen_holdout(registered, holdout)
    assert scored is not registered, "the registered model saw the holdout: it must be refitted"
    metrics, _ = evaluate_estimator(scored, holdout, scored.horizon)
    assert metrics["ece"] <= ECE_BOUND, f"{name} on {trace}: ECE {metrics['ece']:.4f}"


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

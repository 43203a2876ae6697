"""The twin's prior: measured on a holdout only, judged like the twin's test, carried by the model,
and where a consumer's twin starts (at its weight, still able to switch back); bad metadata
gives a clear error or a logged start at w = 0."""

from __future__ import annotations

import copy
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.errors import UserError
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.exactmatch import ExactMatchEstimator
from balanceroute.predict.model_store import save_estimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.oracle import OracleEstimator
from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.ab import ABConfig, run_ab
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, simulate_workload
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.prior import (
    PRIOR_ATTRIBUTE,
    PriorConfig,
    TwinPrior,
    attach_priors,
    model_priors,
    twin_prior,
)
from balanceroute.router.lab.twin.prior_measure import (
    judged,
    measure_folds,
    measure_prior,
    spaced_windows,
)
from balanceroute.router.lab.twin.prior_start import prior_start, prior_test
from balanceroute.router.policies.specs import RouterSpec
from tests.router.helpers import frame

CANDIDATES = (0.0, 0.5, 1.0)
CFG = TwinConfig(candidates=CANDIDATES, block_requests=36, overlap=2, min_windows=2, cooldown=1)
SHAPE = PriorConfig(workers=3, slots=6, windows=6)


def _trace(n: int = 240, seed: int = 5, keys: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 100, n))
    prompts = rng.integers(100, 3000, n)
    outputs = rng.integers(1, 120, n)
    key = [f"k{p}" for p in prompts] if keys else None
    return frame(prompts, outputs, arrivals, keys=key)


def _prior(weight: float = 1.0, workers: int = 3, slots: int = 6, **kw) -> TwinPrior:
    fields = {
        "start_weight": weight,
        "candidates": CANDIDATES,
        "mean_log_ratio": (0.0, -0.1, -0.2),
        "se": (0.0, 0.02, 0.03),
        "upper": (1.0, 0.95, 0.88),
        "windows": 12,
        "overlap": 3.0,
        "block_requests": 36,
        "workers": workers,
        "slots": slots,
        "load": None,
        "holdout_requests": 240,
        "holdout_first_arrival_s": 100.0,
        "holdout_last_arrival_s": 200.0,
    }
    return TwinPrior(**{**fields, **kw})


def test_among_resolved_candidates_the_prior_takes_the_larger_gain():
    """w = 0.5 has the lower upper bound (less noise), w = 1 the larger gain; both resolved."""
    rng = np.random.default_rng(1)
    base = rng.uniform(0.2, 0.4, 16)
    half = base * np.exp(-0.19 + 0.02 * rng.standard_normal(16))
    full = base * np.exp(-0.22 + 0.12 * rng.standard_normal(16))
    common = {
        "candidates": CANDIDATES,
        "block_requests": 36,
        "workers": 3,
        "slots": 6,
        "load": None,
        "holdout_requests": 240,
        "holdout_first_arrival_s": 0.0,
        "holdout_last_arrival_s": 1.0,
    }
    prior = judged(np.column_stack([base, half, full]), CFG, 3.0, 16, common)
    assert prior.upper[1] < prior.upper[2] < math.exp(-CFG.margin)
    assert prior.mean_log_ratio[2] < prior.mean_log_ratio[1] and prior.start_weight == 1.0


def test_the_verdict_is_the_twins_rule_on_the_paired_interval():
    rng = np.random.default_rng(0)
    base = rng.uniform(0.2, 0.4, 12)
    better = np.column_stack([base, base * 0.9, base * rng.uniform(0.75, 0.8, 12)])
    common = {
        "candidates": CANDIDATES,
        "block_requests": 36,
        "workers": 3,
        "slots": 6,
        "load": None,
        "holdout_requests": 240,
        "holdout_first_arrival_s": 0.0,
        "holdout_last_arrival_s": 1.0,
    }
    prior = judged(better, CFG, 3.0, 12, common)
    assert prior.start_weight == 1.0 and prior.upper[2] < math.exp(-CFG.margin)
    assert prior.mean_log_ratio[2] == pytest.approx(np.log(better[:, 2] / base).mean(), abs=1e-5)
    # the same mean with a noise that the interval cannot exclude: stay at w = 0
    noisy = better.copy()
    noisy[:, 2] = base * np.where(np.arange(12) % 2, 0.4, 1.6)
    assert judged(noisy, CFG, 3.0, 12, common).start_weight in (0.0, 0.5)
    worse = np.column_stack([base, base * 1.1, base * 1.3])
    assert judged(worse, CFG, 3.0, 12, common).start_weight == 0.0


def test_the_prior_replays_only_the_holdout_given_and_is_deterministic():
    trace = _trace(seed=7)
    est = SurvivalEstimator(horizon=16).fit(_trace(seed=8))
    prior = measure_prior(copy.deepcopy(est), trace, SHAPE, CFG)
    assert prior.holdout_requests == len(trace) and prior.windows == SHAPE.windows
    assert prior.holdout_first_arrival_s == trace["arrival_s"].min()
    assert prior.holdout_last_arrival_s == trace["arrival_s"].max()
    assert prior.overlap == pytest.approx(SHAPE.windows * 36 / len(trace), abs=1e-4)
    assert measure_prior(copy.deepcopy(est), trace, SHAPE, CFG) == prior
    # the evidence is the holdout's: another holdout, other evidence
    other = _trace(seed=9)
    assert measure_prior(copy.deepcopy(est), other, SHAPE, CFG).mean_log_ratio != (
        prior.mean_log_ratio
    )


def test_the_prior_would_show_a_model_that_saw_the_holdout():
    """exactmatch memorises outputs by prompt key: one that saw the holdout (a leak) replays it
    with the true outputs, and its prior differs; training's leakage test rests on this."""
    trace = _trace(seed=3, keys=True)
    fresh = ExactMatchEstimator(horizon=16).fit(_trace(seed=4, keys=True).iloc[:5])
    leaked = copy.deepcopy(fresh)
    leaked.fit(trace)  # knows every holdout output
    a = measure_prior(copy.deepcopy(fresh), trace, SHAPE, CFG)
    b = measure_prior(copy.deepcopy(leaked), trace, SHAPE, CFG)
    assert a.mean_log_ratio != b.mean_log_ratio  # a leak shows


def test_a_holdout_shorter_than_a_block_gives_no_evidence():
    est = SurvivalEstimator(horizon=16).fit(_trace())
    prior = measure_prior(est, _trace(30), SHAPE, CFG)
    assert prior.windows == 0 and prior.start_weight == 0.0 and "fewer than one block" in prior.note
    assert prior.note.startswith("the holdout's 30 requests")


def test_folds_shorter_than_a_block_are_named_folds_not_a_holdout():
    est = SurvivalEstimator(horizon=16).fit(_trace())
    short = _trace(60)
    folds = [(copy.deepcopy(est), short.iloc[:30]), (copy.deepcopy(est), short.iloc[30:])]
    prior = measure_folds(folds, SHAPE, CFG)
    assert prior.windows == 0 and prior.folds == 2
    assert "each of the 2 cross-fitted folds holds at most 30 requests" in prior.note
    assert "holdout" not in prior.note


def test_round_trip_and_bad_metadata_is_named():
    prior = _prior()
    assert TwinPrior.from_dict(prior.as_dict()) == prior
    d = prior.as_dict()
    for broken, words in [
        ({k: v for k, v in d.items() if k != "start_weight"}, "missing field(s) start_weight"),
        ({**d, "workers": "eight"}, "wrong type"),
        ({**d, "start_weight": 0.7}, "start_weight is not one of the candidates"),
        ({**d, "se": [0.1]}, "one value per candidate"),
        ({**d, "version": 99}, "version 99"),
        ({**d, "load": -1}, "load must be > 0"),
    ]:
        with pytest.raises(UserError, match=r"twin prior of m\.joblib") as err:
            TwinPrior.from_dict(broken, "m.joblib")
        assert words in str(err.value)
    est = SurvivalEstimator(horizon=16).fit(_trace())
    assert model_priors(est) == [] and prior_start(est, 3, 6, None) is None
    setattr(est, PRIOR_ATTRIBUTE, {"not": "a list"})
    with pytest.raises(UserError, match="expected a list"):
        model_priors(est)
    start = prior_start(est, 3, 6, None)  # a consumer falls back to w = 0 and says why
    assert start.test is None and "expected a list" in start.note and "w = 0" in start.note


def test_the_prior_of_the_groups_shape_sets_the_start_and_another_shape_is_not_used():
    est = SurvivalEstimator(horizon=16).fit(_trace())
    attach_priors(est, [_prior(1.0, 3, 6), _prior(0.5, 3, 12)])
    assert twin_prior(est) == _prior(1.0, 3, 6)
    assert twin_prior(est, 3, 12).start_weight == 0.5 and twin_prior(est, 4, 6) is None
    start = prior_start(est, 3, 12, 1.1, CFG)
    assert start.test.weight == 0.5 and start.stats["twin_prior"] == "used"
    assert "3x12 saturated" in start.note and "at 1.1x" in start.note
    other = prior_start(est, 8, 64, None, CFG)
    assert other.test is None and "this group is 8x64" in other.note
    narrow = TwinConfig(candidates=(0.0, 1.0))
    assert prior_start(est, 3, 12, None, narrow).test is None  # 0.5 is no candidate there


def test_the_twin_starts_at_the_prior_and_can_still_switch_back():
    test = prior_test(_prior(1.0), CFG)
    assert test.weight == 1.0 and test.decisions == 0
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), 3, 6)
    twin = DecodeTwin(group, SurvivalEstimator(horizon=16).fit(_trace()), CFG, warm=test)
    assert twin.weight == 1.0
    # its own evidence says the estimator harms: back to w = 0 after min_windows, cooldown
    for _ in range(CFG.min_windows - 1):
        assert test.add(np.array([1.0, 1.3, 1.6])) == 1.0
    assert test.add(np.array([1.0, 1.3, 1.6])) == 0.0 and test.switches == 1
    # and evidence for it keeps it
    keep = prior_test(_prior(1.0), CFG)
    for _ in range(6):
        assert keep.add(np.array([1.0, 0.9, 0.7])) == 1.0


def _with_prior(tmp_path, weight: float, workers: int = 3, slots: int = 6) -> str:
    est = SurvivalEstimator(horizon=16).fit(_trace(seed=11))
    attach_priors(est, [_prior(weight, workers, slots, block_requests=128)])
    return str(save_estimator(est, tmp_path / "survival.joblib"))


def test_simulate_and_ab_start_a_registered_models_twin_at_its_prior(tmp_path):
    path = _with_prior(tmp_path, 1.0)
    assert twin_prior(path).start_weight == 1.0  # through the file, as a service loads it
    spec = ReplaySpec(
        router=RouterSpec.parse(f"brh:survival@{path}{{horizon=16}}"),
        workers=3,
        slots=6,
        prefill=PrefillConfig(saturate=True),
    )
    notes: list[str] = []
    summary = simulate_workload(_trace(300), {"kind": "t"}, spec, tmp_path / "s", log=notes.append)
    assert summary["twin_prior"] == "used" and summary["twin_prior_weight"] == 1.0
    assert summary["twin_weight_mean"] > 0.5  # it routed with the estimator from the start
    assert any("starting at w = 1" in n for n in notes)
    cfg = ABConfig(
        arms=(RouterSpec.parse("brh:none{horizon=16}"), spec.router),
        slots=6,
        workers=(3,),
        repeats=3,
        window_requests=100,
        saturate=True,
        reference="brh:none",
        twin=TwinConfig(block_requests=128),
    )
    raw = run_ab(_trace(400), cfg)
    stats = raw["info"]["twin"][f"{spec.router.label} G=3"]
    assert stats["twin_prior"] == "used"
    weights = [
        t["summary"]["twin_weight_mean"] for t in raw["tasks"] if t["arm"] == spec.router.label
    ]
    assert weights and all(w == 1.0 for w in weights)


def test_another_shape_leaves_the_twin_at_zero(tmp_path):
    path = _with_prior(tmp_path, 1.0, workers=8, slots=32)
    spec = ReplaySpec(
        router=RouterSpec.parse(f"brh:survival@{path}{{horizon=16}}"),
        workers=3,
        slots=6,
        prefill=PrefillConfig(saturate=True),
    )
    notes: list[str] = []
    summary = simulate_workload(_trace(300), {"kind": "t"}, spec, tmp_path / "s", log=notes.append)
    assert summary["twin_prior"] == "other shape" and summary["twin_weight_mean"] == 0.0
    assert any("this group is 3x6" in n for n in notes)


def _paper_prod_folds(requests: int = 2000) -> list[pd.DataFrame]:
    trace, _ = load_workload(WorkloadSpec(preset="paper-prod", requests=requests, seed=1))
    trace = trace.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    half = requests // 2
    return [trace.iloc[:half].reset_index(drop=True), trace.iloc[half:].reset_index(drop=True)]


def test_the_oracle_comes_out_trusted_and_none_stays_at_zero():
    """A constructed case: where exact knowledge is worth much (paper-prod's long outputs, a
    4 x 8 group), the prior of an estimator that is the oracle starts above w = 0; one that
    predicts nothing (``none``: the blend changes nothing) stays at w = 0, exactly."""
    folds = _paper_prod_folds()
    shape = PriorConfig(workers=4, slots=8, windows=8)
    oracle = measure_folds([(OracleEstimator(horizon=80).fit(r), r) for r in folds], shape)
    assert oracle.start_weight > 0.0
    assert oracle.upper[TwinConfig().candidates.index(oracle.start_weight)] < math.exp(-0.01)
    none = measure_folds([(NoPrediction(horizon=80).fit(), r) for r in folds], shape)
    assert none.start_weight == 0.0 and none.upper == (1.0, 1.0, 1.0)
    assert none.mean_log_ratio == (0.0, 0.0, 0.0)


_windows = st.integers(2, 24)


@settings(max_examples=200, deadline=None)
@given(
    n=_windows,
    seed=st.integers(0, 10_000),
    effect=st.floats(-0.5, 0.5),
    noise=st.floats(0.0, 0.6),
    overlap=st.floats(0.5, 12.0),
)
def test_do_no_harm_the_prior_moves_only_on_a_resolved_gain(n, seed, effect, noise, overlap):
    rng = np.random.default_rng(seed)
    base = rng.uniform(0.05, 2.0, n)
    logs = effect + noise * rng.standard_normal((n, 2))
    metric = np.column_stack([base, base * np.exp(logs[:, 0]), base * np.exp(logs[:, 1])])
    common = {
        "candidates": CANDIDATES,
        "block_requests": 36,
        "workers": 3,
        "slots": 6,
        "load": None,
        "holdout_requests": 240,
        "holdout_first_arrival_s": 0.0,
        "holdout_last_arrival_s": 1.0,
    }
    prior = judged(metric, CFG, overlap, n, common)
    j = CANDIDATES.index(prior.start_weight)
    bar = math.exp(-CFG.margin)
    if j:  # a move: its interval's upper end is below the bar, its mean a gain, the largest
        assert prior.upper[j] < bar and prior.mean_log_ratio[j] < 0
        resolved = [m for m, u in zip(prior.mean_log_ratio, prior.upper, strict=True) if u < bar]
        assert prior.mean_log_ratio[j] == min(resolved)
    else:
        assert min(prior.upper) >= bar
    # a candidate never better than w = 0 in any window is never chosen
    worse = metric.copy()
    worse[:, 1:] = np.maximum(worse[:, 1:], base[:, None])
    assert judged(worse, CFG, overlap, n, common).start_weight == 0.0
    # the verdict is paired: scaling a window (every candidate alike) changes nothing
    scaled = metric * rng.uniform(0.1, 10.0, (n, 1))
    assert judged(scaled, CFG, overlap, n, common).start_weight == prior.start_weight
    # more overlap (less independent evidence) never makes a move more likely
    if not j:
        assert judged(metric, CFG, overlap * 2, n, common).start_weight == 0.0


def test_windows_are_spaced_no_closer_than_the_twins_own_blocks():
    assert spaced_windows(6000, 2048, 2) == 6  # the pipeline's judge slice at 8x32
    assert spaced_windows(9683, 2048, 2) == 9  # a cross-fitted half of Azure: 8 asked, 8 kept
    assert spaced_windows(2100, 2048, 2) == 2  # always a pair to compare
    # a long holdout asked for few windows keeps them; a short one asked for many is capped
    trace = _trace(seed=7)
    est = SurvivalEstimator(horizon=16).fit(_trace(seed=8))
    cap = spaced_windows(len(trace), 36, CFG.overlap)
    many = PriorConfig(workers=3, slots=6, windows=cap + 10)
    prior = measure_prior(copy.deepcopy(est), trace, many, CFG)
    assert prior.windows == cap
    assert prior.overlap == pytest.approx(cap * 36 / len(trace), abs=1e-4)

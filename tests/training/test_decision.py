"""The decision-aware scores, the replay scores and the recommendation drawn from them."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.synthetic import generate
from balanceroute.predict.base import survival_from_remaining
from balanceroute.predict.registry import make_estimator
from balanceroute.router.lab.twin import config as twin_config
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.lab.twin.prior import PriorConfig, TwinPrior, attach_priors
from balanceroute.router.lab.twin.prior_measure import measure_prior
from balanceroute.router.policies.balance_config import BRH_DEFAULTS, GAMMA_MAX, GAMMA_MIN
from balanceroute.router.policies.balance_route import BRHPolicy
from balanceroute.router.policies.policy import RunContext
from balanceroute.router.policies.state import RequestTable
from balanceroute.training.decision import curve_scores, lookahead_weights, router_gamma
from balanceroute.training.holdout import make_holdout
from balanceroute.training.recommend import RANKING_SCORES, REFERENCE, recommend
from balanceroute.training.replay_scores import (
    NO_TWIN,
    ReplayScoreConfig,
    pooled_verdict,
    replay_scores,
    state_errors,
    twin_scores,
)

H = 20


def test_router_gamma_is_brh_auto_gamma_rule():
    out = np.array([100, 300, 500])
    assert router_gamma(out, 32) == pytest.approx(1 - BRH_DEFAULTS.auto_gamma * 32 / 300)
    assert router_gamma(out, 64) == pytest.approx(1 - BRH_DEFAULTS.auto_gamma * 64 / 300)
    assert router_gamma(np.array([10]), 16) == GAMMA_MIN
    assert router_gamma(np.array([10**7]), 64) == GAMMA_MAX


@pytest.mark.parametrize("slots", [4, 32, 64])
def test_router_gamma_is_what_brh_sets(slots):
    # BR-H itself, fed these completions, settles on the discount evaluate scores with
    rng = np.random.default_rng(slots)
    out = rng.integers(20, 900, 400)
    n = out.size
    table = RequestTable(
        prompt_tokens=np.full(n, 100, dtype=np.int64),
        prompt_key=np.zeros(n, dtype=np.uint64),
        trace_index=np.arange(n),
    )
    policy = BRHPolicy()
    policy.reset(RunContext(8, slots, table))
    policy.on_complete(np.arange(n), out, 1.0, int(out.max()))
    assert policy.gamma == pytest.approx(router_gamma(out, slots), abs=0.002)


def test_curve_scores_of_exact_and_of_no_knowledge():
    rng = np.random.default_rng(0)
    r = rng.integers(1, 60, 500)
    w = rng.integers(1, 9, 500).astype(float)
    exact = curve_scores(survival_from_remaining(r, H), r, 0.9, H, w)
    assert exact["ibs_discounted"] == 0.0 and exact["brier_at_8"] == 0.0
    assert exact["auc_at_8"] == 1.0 and exact["auc_at_16"] == 1.0
    blind = curve_scores(np.ones((r.size, H + 1)), r, 0.9, H, w)
    for k in (8, 16):  # a curve of ones errs by 1 on every request gone by k
        assert blind[f"brier_at_{k}"] == pytest.approx(np.average(r <= k, weights=w))
    gone = np.array([np.average(r <= k, weights=w) for k in range(1, H + 1)])
    assert blind["ibs_discounted"] == pytest.approx(gone @ lookahead_weights(H, 0.9))
    assert blind["ibs_discounted_per_request"] == pytest.approx(
        np.mean(r[:, None] <= np.arange(1, H + 1), axis=0) @ lookahead_weights(H, 0.9)
    )
    assert "brier_at_40" not in blind  # beyond the horizon


@settings(max_examples=50, deadline=None)
@given(
    st.integers(min_value=2, max_value=6),
    st.integers(min_value=0, max_value=2**31),
    st.floats(min_value=-500, max_value=500),
)
def test_margin_error_ignores_what_every_worker_shares(workers, seed, shift):
    """An error common to every worker moves no margin: the margin error is unchanged."""
    rng = np.random.default_rng(seed)
    departed = rng.random((workers, H + 1)) * 1000
    actual = rng.random((workers, H + 1)) * 1000
    w = lookahead_weights(H, 0.85)
    total, margin = state_errors(departed, actual, 5000.0, w)
    moved = state_errors(departed + shift * rng.random((1, H + 1)), actual, 5000.0, w)
    assert moved[1] == pytest.approx(margin, rel=1e-9, abs=1e-12)
    assert state_errors(actual, actual, 5000.0, w) == (0.0, 0.0)
    assert total >= margin / 2  # centring at most doubles the total absolute error


def test_replay_scores_oracle_projects_exactly_and_none_is_its_own_reference():
    trace = generate("mooncake-conv", 1600, seed=2)
    holdout = make_holdout(trace)
    test = holdout.test
    ests = {
        "oracle": make_estimator("oracle", horizon=H).fit(test),
        "survival": make_estimator("survival", horizon=H).fit(holdout.train),
        REFERENCE: make_estimator("none", horizon=H).fit(),
    }
    cfg = ReplayScoreConfig(workers=4, slots=8, repeats=1, every=3)
    out = replay_scores(ests, test, 0.9, H, cfg)
    assert out["oracle"]["proj_error"] == 0.0 and out["oracle"]["proj_error_margin"] == 0.0
    assert out[REFERENCE]["replay_ratio"] == 1.0
    assert out["survival"]["proj_states"] > 10
    assert out[REFERENCE]["proj_error"] > 0  # it projects no departure while some happen
    assert all(np.isfinite(v) for m in out.values() for v in m.values())


def test_recommendation_picks_the_best_beats_none_by_a_margin_and_skips_nan():
    m = {
        REFERENCE: {"replay_ratio": 1.0, "auc_at_8": 0.5},
        "survival": {"replay_ratio": 0.95, "auc_at_8": 0.7},
        "gbdt": {"replay_ratio": 1.2, "auc_at_8": 0.9},
        "hazard": {"replay_ratio": math.nan, "auc_at_8": 0.8},
    }
    assert recommend(m, "replay_ratio").pick == "survival"
    assert recommend(m, "replay_ratio", margin=0.1).pick == REFERENCE
    assert recommend(m, "auc_at_8").pick == "gbdt"  # higher is better
    assert recommend(m, "auc_at_8", deployable={"survival"}).pick == "survival"
    assert "hazard" not in recommend(m, "replay_ratio").scores
    lost = {k: {"replay_ratio": math.nan} for k in m}
    assert recommend(lost, "replay_ratio").pick == REFERENCE
    with pytest.raises(ValueError, match="unknown score"):
        recommend(m, "charisma")
    assert recommend(m, "replay_ratio").line().startswith("recommendation: survival (by ")


def test_the_twin_ratio_decides_first_and_none_wins_when_the_twin_keeps_no_prediction():
    m = {
        REFERENCE: {"twin_ratio": 1.0, "replay_ratio": 1.0},
        "survival": {"twin_ratio": 1.0, "replay_ratio": 0.8},
        "gbdt": {"twin_ratio": 1.0, "replay_ratio": 1.1},
    }
    assert recommend(m).score == RANKING_SCORES[0] == "twin_ratio"
    assert recommend(m).pick == REFERENCE  # the twin found nobody significantly better
    m["gbdt"]["twin_ratio"] = 0.9
    assert recommend(m).pick == "gbdt"


def test_replay_ratio_routes_unguarded_unless_asked():
    # the guard would stand aside on short replays and make every ratio 1
    assert ReplayScoreConfig().spec(20).router.options["guard"] is False
    assert ReplayScoreConfig().spec(20).router.options["twin"] is False  # the estimator itself
    assert ReplayScoreConfig(guard=True).spec(20).router.options["guard"] is True


def test_recommendation_by_default_falls_back_when_the_replay_ratio_is_unmeasured():
    m = {
        REFERENCE: {"replay_ratio": 1.0, "proj_error_margin": 0.030},
        "survival": {"replay_ratio": 0.9, "proj_error_margin": 0.031},
        "gbdt": {"replay_ratio": 1.1, "proj_error_margin": 0.020},
    }
    # no twin ratio measured (evaluate without the twin): the replay ratio decides
    assert recommend(m).pick == "survival" and recommend(m).score == RANKING_SCORES[1]
    for k in m:  # no steady state in the replays: no replay ratio for anyone
        m[k]["replay_ratio"] = math.nan
    rec = recommend(m)
    assert (rec.pick, rec.score) == ("gbdt", "proj_error_margin")
    for k in m:
        m[k]["proj_error_margin"] = math.nan
    assert recommend(m).pick == REFERENCE


def test_twin_scores_are_the_twins_verdict_on_the_holdout(monkeypatch):
    """Every estimator gets the twin's ratio, weight and bound from its paired test on the
    holdout; ``none`` and references are 1 and 0; a weight above 0 comes with a ratio below 1
    (the twin only moves on a gain)."""
    monkeypatch.setattr(twin_config, "BLOCK_SLOT_MULTIPLE", 4)  # blocks of 4 G B = 64 requests
    trace = generate("mooncake-conv", 1600, seed=2)
    holdout = make_holdout(trace)
    ests = {
        "oracle": make_estimator("oracle", horizon=H).fit(holdout.test),
        "survival": make_estimator("survival", horizon=H).fit(holdout.train),
        REFERENCE: make_estimator("none", horizon=H).fit(),
    }
    cfg = ReplayScoreConfig(workers=2, slots=8, twin_windows=6)
    out = twin_scores(ests, holdout.test, cfg)
    assert (
        out[REFERENCE]
        == out["oracle"]
        == {"twin_ratio": 1.0, "twin_weight": 0.0, "twin_upper": 1.0, "twin_from_prior": 0.0}
    )
    s = out["survival"]
    assert set(s) == {"twin_ratio", "twin_weight", "twin_upper", "twin_from_prior"}
    assert s["twin_from_prior"] == 0.0  # a model without a prior
    verdict = measure_prior(ests["survival"], holdout.test, PriorConfig(2, 8, None, 6))
    assert s["twin_weight"] == verdict.start_weight  # the twin's own test on these requests
    if s["twin_weight"] > 0:
        assert s["twin_ratio"] < 1.0 and s["twin_upper"] < 1.0
    else:
        assert s["twin_ratio"] == 1.0


def _prior_1() -> TwinPrior:
    return TwinPrior(
        start_weight=1.0,
        candidates=(0.0, 0.5, 1.0),
        mean_log_ratio=(0.0, -0.05, -0.2),
        se=(0.0, 0.03, 0.05),
        upper=(1.0, 1.05, 0.9),
        windows=12,
        overlap=4.0,
        block_requests=128,
        workers=2,
        slots=8,
        load=None,
        holdout_requests=500,
        holdout_first_arrival_s=0.0,
        holdout_last_arrival_s=1.0,
    )


def test_twin_scores_quote_a_models_prior_for_a_short_holdout_and_pool_it_with_a_longer_one():
    """A model carrying a prior for the group: a holdout shorter than one block (2 x 8 x 8 =
    128 requests) gives the prior's weight and evidence; a holdout of one block or more gives
    the twin's test on it pooled with the prior by inverse variance (neither quoted alone)."""
    trace = generate("mooncake-conv", 900, seed=2)
    holdout = make_holdout(trace)
    est = make_estimator("survival", horizon=H).fit(holdout.train)
    prior = _prior_1()
    attach_priors(est, [prior])
    cfg = ReplayScoreConfig(2, 8)
    s = twin_scores({"survival": est}, holdout.test.iloc[:100], cfg)["survival"]
    assert s["twin_weight"] == 1.0 and s["twin_from_prior"] == 1.0
    assert s["twin_ratio"] == pytest.approx(np.exp(-0.2)) and s["twin_upper"] == pytest.approx(0.9)
    part = holdout.test.iloc[:200]
    s = twin_scores({"survival": est}, part, cfg)["survival"]
    verdict = measure_prior(est, part, PriorConfig(2, 8, None, cfg.twin_windows))
    assert verdict.windows > 0
    expected = pooled_verdict(
        verdict.candidates,
        (verdict.mean_log_ratio, verdict.se),
        (prior.mean_log_ratio, prior.se),
        TwinConfig().margin,
    )
    assert s == pytest.approx(expected)
    if s["twin_weight"] > 0:
        assert 0.0 < s["twin_from_prior"] < 1.0 and s["twin_upper"] < 1.0


def test_pooling_resolves_what_neither_short_holdout_resolves_and_heeds_strong_contrary_evidence():
    candidates = (0.0, 0.5, 1.0)
    prior = ((0.0, -0.05, -0.2), (0.0, 0.03, 0.05))
    weak = ((0.0, -0.05, -0.15), (0.0, 0.1, 0.1))  # alone: exp(-0.15 + 0.2) = 1.05, unresolved
    s = pooled_verdict(candidates, weak, prior, 0.01)
    assert s["twin_weight"] == 1.0
    assert s["twin_ratio"] == pytest.approx(np.exp(-0.19))  # (-0.15 * 100 - 0.2 * 400) / 500
    assert s["twin_upper"] == pytest.approx(np.exp(-0.19 + 2 / np.sqrt(500)))
    assert s["twin_from_prior"] == pytest.approx(0.8)
    against = ((0.0, 0.1, 0.3), (0.0, 0.02, 0.02))  # a long holdout where prediction hurts
    assert pooled_verdict(candidates, against, prior, 0.01) == NO_TWIN
    nothing = ((0.0, 0.0, 0.0), (0.0, 0.0, 0.0))  # no evidence at all: no move
    assert pooled_verdict(candidates, nothing, nothing, 0.01) == NO_TWIN

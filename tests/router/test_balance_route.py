"""BR-0 / BR-H decisions on hand-built states: fairness cap, KV capacity, stages, projections."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.predict.oracle import OracleEstimator
from balanceroute.predict.projection import (
    LoadProjection,
    cutoff_survival,
    request_paths,
)
from balanceroute.router.lab.metrics import queue_delay_s
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.balance_route import BalanceRouteConfig, BR0Policy, BRHPolicy
from balanceroute.router.policies.baselines import CountJSQPolicy
from balanceroute.router.policies.kernels import br_step
from balanceroute.router.policies.policy import RunContext
from balanceroute.router.policies.scoring import discount_weights
from balanceroute.router.policies.state import ArrayPool, RequestTable, RouterState, RunningRequests
from tests.router.helpers import frame, released
from tests.router.reference_br import reference_step


def make_state(loads, free, pool_prompts, overtaken=None, iteration=0):
    n = len(pool_prompts)
    table = RequestTable(
        prompt_tokens=np.asarray(pool_prompts, dtype=np.int64),
        prompt_key=np.zeros(n, dtype=np.uint64),
        trace_index=np.arange(n),
    )
    empty = np.zeros(0, dtype=np.int64)
    return RouterState(
        iteration=iteration,
        time_s=0.0,
        free_slots=np.asarray(free, dtype=np.int64),
        active=np.zeros(len(loads), dtype=np.int64),
        pool=ArrayPool(np.arange(n), overtaken=overtaken),
        requests=table,
        running_source=lambda: RunningRequests(empty, empty, empty, empty, empty),
        loads_source=lambda: np.asarray(loads, dtype=float),
    ), table


def decide(policy, state, table):
    policy.reset(RunContext(len(state.loads), 4, table))
    adm = policy.route(state)
    return list(zip(adm.positions.tolist(), adm.workers.tolist(), strict=True))


def test_br0_fills_the_gap_with_the_request_that_fits():
    # worker 0 is 1,000 tokens below the max: the 900-token request fits, 5,000 overflows
    state, table = make_state([0, 1000], [1, 0], [5000, 900, 10])
    assert decide(BR0Policy(), state, table) == [(1, 0)]


def test_br0_single_fallback_when_no_subset_scores_positive():
    # worker 0 is the max (margin 0): every choice overflows; the smallest overflow wins
    state, table = make_state([1000, 0], [1, 0], [500, 40, 300])
    assert decide(BR0Policy(), state, table) == [(1, 0)]


def test_stage2_admits_a_subset_that_fills_the_margin():
    # worker 0 has 2 slots and 1,000 tokens of margin: {600, 400} fills it exactly
    state, table = make_state([0, 1000], [2, 0], [600, 2000, 400, 3000])
    got = decide(BR0Policy(s_greedy=2), state, table)
    assert sorted(got) == [(0, 0), (2, 0)]


def test_fairness_cap_admits_an_overdue_request_first():
    state, table = make_state([0, 1000], [1, 0], [5000, 900], overtaken=[5, 0])
    assert decide(BR0Policy(max_overtake=5), state, table) == [(0, 0)]
    state, table = make_state([0, 1000], [1, 0], [5000, 900], overtaken=[4, 0])
    assert decide(BR0Policy(max_overtake=5), state, table) == [(1, 0)]


def test_age_priority_lets_an_overtaken_small_request_in():
    """Stage 1 gives the free slot the prompt that fills the margin best (the larger one); once
    enough later admissions have passed the small request, its bonus wins the slot, before any
    overtake cap would force it."""

    def small_first(passed, every):
        state, table = make_state([0, 2000], [1, 0], [100, 1500], overtaken=[passed, 0])
        policy = BRHPolicy(horizon=0, s_greedy=0, age_priority=every, max_overtake=None)
        return decide(policy, state, table) == [(0, 0)]

    assert not small_first(0, 32.0)
    assert not small_first(5, None)
    assert not small_first(5, 32.0)  # the bonus is not yet worth the better fill
    assert small_first(5, 1.0)
    assert small_first(400, 32.0)
    assert not small_first(10_000, None)


def test_late_age_priority_counts_only_passes_after_fifo_would_have_admitted():
    """With ``age_late`` a request earns its bonus only for admissions that passed it after
    first-come first-served would have taken it: passes while older requests still wait
    (here one, 3,000 tokens) do not count."""

    def small_first(passed, late):
        state, table = make_state([0, 2000], [1, 0], [3000, 100, 1500], overtaken=[0, passed, 0])
        policy = BRHPolicy(
            horizon=0, s_greedy=0, age_priority=1.0, age_late=late, max_overtake=None
        )
        return decide(policy, state, table) == [(1, 0)]

    assert small_first(2, late=False)  # two passes: two typical prompts of bonus
    assert not small_first(1, late=True)  # one pass, one older request waiting: not late
    assert small_first(3, late=True)


def test_age_priority_bounds_the_worst_wait_in_a_replay():
    """At about 1.1x capacity, requests that never fill a margin best wait several times
    first-come first-served's worst without the age priority, and less than twice it with the
    default."""
    rng = np.random.default_rng(3)
    n = 400
    prompts = rng.integers(1500, 3000, n)
    prompts[::10] = 50
    rq = released(prompts, rng.integers(20, 60, n), np.arange(n) * 0.2, saturate=False)
    cfg = SimConfig(workers=2, slots=4)

    def worst(policy):
        return float(queue_delay_s(simulate(rq, policy, cfg)).max())

    fifo = worst(CountJSQPolicy())
    assert worst(BRHPolicy(horizon=0, age_priority=None, max_overtake=None)) > 3 * fifo
    assert worst(BRHPolicy(horizon=0, max_overtake=None)) < 2 * fifo


def test_kv_capacity_holds_back_what_does_not_fit():
    state, table = make_state([900, 0], [1, 1], [300, 200])
    # worker 0 can take at most 100 more tokens; worker 1 can take 1,000
    got = decide(BR0Policy(kv_capacity=1000, s_greedy=0), state, table)
    assert all(w == 1 for _, w in got) and len(got) == 1
    policy = BRHPolicy(kv_capacity=1000, horizon=3, s_greedy=0)
    got = decide(policy, state, table)
    assert all(w == 1 for _, w in got)


@settings(max_examples=200, deadline=None)
@given(
    g=st.integers(1, 5),
    h=st.integers(0, 6),
    n=st.integers(1, 14),
    data=st.data(),
    beta=st.floats(0.5, 50),
    gamma=st.floats(0.3, 1.0),
    penalty_max=st.booleans(),
    s_greedy=st.integers(0, 6),
    window=st.integers(1, 6),
    r_max=st.integers(1, 5),
    capped=st.booleans(),
)
def test_kernel_matches_the_python_reference(
    g, h, n, data, beta, gamma, penalty_max, s_greedy, window, r_max, capped
):
    loads = np.array(
        data.draw(
            st.lists(
                st.lists(st.integers(0, 5000), min_size=h + 1, max_size=h + 1),
                min_size=g,
                max_size=g,
            )
        ),
        float,
    )
    free = np.array(data.draw(st.lists(st.integers(0, 3), min_size=g, max_size=g)), np.int64)
    prompts = np.array(data.draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n)), float)
    overdue = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    aged = data.draw(st.booleans())  # an age-priority bonus on some candidates
    bonus = np.array(
        data.draw(st.lists(st.floats(0, 5e4) if aged else st.just(0.0), min_size=n, max_size=n))
    )
    cap = float(data.draw(st.integers(2000, 12000))) if capped else np.inf
    weights = discount_weights(h, gamma)
    due = int(min(n, free.sum()))
    stats = np.zeros(4, dtype=np.int64)
    idx, wk = br_step(
        loads.copy(),
        free.copy(),
        prompts,
        overdue,
        bonus,
        weights,
        beta,
        penalty_max,
        cap,
        s_greedy,
        window,
        r_max,
        due,
        stats,
    )
    want = reference_step(
        loads.tolist(),
        free.tolist(),
        prompts.tolist(),
        overdue.tolist(),
        weights.tolist(),
        beta,
        penalty_max,
        cap,
        s_greedy,
        window,
        r_max,
        due,
        bonus.tolist(),
    )
    assert list(zip(idx.tolist(), wk.tolist(), strict=True)) == want
    if not capped:
        assert len(want) == due


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    workers=st.integers(1, 8),
    policy=st.sampled_from(["br0", "brh0", "brh"]),
    s_greedy=st.integers(0, 12) | st.none(),
    refill=st.booleans(),
    passed=st.integers(0, 6),
    prompt=st.integers(1, 4000),
)
def test_a_lone_request_is_decided_as_the_step_decides_it(
    data, workers, policy, s_greedy, refill, passed, prompt
):
    """One waiting request: the stage-1 shortcut (no projection built) admits it where the
    compiled step does, with the same counts and refill prompt, and is taken whenever stage 1
    would run (free slots above ``s_greedy``, the request not overdue)."""
    free = data.draw(st.lists(st.integers(0, 3), min_size=workers, max_size=workers))
    loads = data.draw(st.lists(st.integers(0, 3).map(lambda x: 1000 * x), min_size=workers,
                               max_size=workers))  # fmt: skip
    opts = {"s_greedy": s_greedy, "refill": refill, "max_overtake": 4}
    make = {"br0": lambda: BR0Policy(**opts), "brh0": lambda: BRHPolicy(horizon=0, **opts),
            "brh": lambda: BRHPolicy(**opts)}[policy]  # fmt: skip
    fast, step = make(), make()
    step._scores_aside = lambda: False  # always the compiled step
    taken = []
    lone = fast._lone
    fast._lone = lambda state, cand: taken.append(lone(state, cand)) or taken[-1]
    got = []
    for p in (fast, step):
        state, table = make_state(loads, free, [prompt], overtaken=[passed])
        got.append((decide(p, state, table), p.counters.tolist(), p.refill_prompt))
    assert got[0] == got[1]
    stage1 = sum(free) > (workers if s_greedy is None else s_greedy) and passed < 4
    assert taken == [] or (taken[0] is not None) == stage1
    assert (taken != []) == (sum(free) > 0)  # the shortcut is tried for every lone request


def test_brh_with_none_at_horizon_zero_is_br0():
    rng = np.random.default_rng(5)
    rq = released(rng.integers(1, 4000, 300), rng.integers(1, 60, 300))
    cfg = SimConfig(workers=3, slots=5)
    a = simulate(rq, BR0Policy(), cfg)
    b = simulate(rq, BRHPolicy(horizon=0, beta=None, s_greedy=None, age_priority=None), cfg)
    np.testing.assert_array_equal(a.worker, b.worker)


def test_projection_shifts_between_refreshes():
    # predicted at k0 = 10 (H = 6): request 0 leaves after 5 offsets, request 1 (c = H) never
    proj = LoadProjection(1, 6, 3, 2)
    proj.rebuild_cutoff(
        10, np.array([0, 1]), np.array([0, 0]), np.array([100, 7]), np.array([5.0, 6.0])
    )
    # two iterations later: request 0 (now 102) has 3 offsets left, request 1 (now 9) stays
    view = proj.view(12, np.array([111.0]))
    np.testing.assert_allclose(view[0], [111, 103 + 10, 104 + 11, 12, 13, 14, 15])


def test_oracle_brh_beats_none_at_the_paper_defaults():
    rng = np.random.default_rng(8)
    prompts, outputs = rng.integers(100, 3000, 800), rng.integers(1, 400, 800)
    fr = frame(prompts, outputs)
    rq = released(prompts, outputs)
    cfg = SimConfig(workers=4, slots=8)
    opts = {"horizon": 80, "gamma": 0.64, "beta": 14.67}
    with_oracle = simulate(rq, BRHPolicy(estimator=OracleEstimator().fit(fr), **opts), cfg)
    without = simulate(rq, BRHPolicy(**opts), cfg)
    steady = with_oracle.waiting > 0
    assert with_oracle.imbalance[steady].mean() < without.imbalance[without.waiting > 0].mean()


@pytest.mark.parametrize("refill", [None, 700.0])
def test_cutoff_projection_fast_path_equals_explicit_paths(refill):
    rng = np.random.default_rng(2)
    n, g, horizon, span = 40, 3, 10, 4
    workers = rng.integers(0, g, n)
    workload = rng.integers(1, 5000, n)
    c = rng.uniform(1, horizon, n)
    c[:5] = horizon
    length = horizon + span + 1
    fast = LoadProjection(g, horizon, span, n)
    fast.rebuild_cutoff(10, np.arange(n), workers, workload, c, refill)
    slow = LoadProjection(g, horizon, span, n)
    paths = request_paths(workload, cutoff_survival(c, horizon, length), refill)
    slow.rebuild_paths(10, np.arange(n), workers, paths)
    np.testing.assert_allclose(fast.base, slow.base)
    gone = np.array([0, 3, 17, 39])
    fast.remove(gone)
    slow.remove(gone)
    np.testing.assert_allclose(fast.base, slow.base, atol=1e-6)
    expect = np.zeros((g, length))
    keep = np.setdiff1d(np.arange(n), gone)
    np.add.at(expect, workers[keep], paths[keep])
    np.testing.assert_allclose(fast.base, expect, atol=1e-6)


def test_projection_view_counts_new_admissions_as_growing():
    proj = LoadProjection(2, 3, 2, 10)
    proj.rebuild_cutoff(5, np.array([0]), np.array([0]), np.array([100]), np.array([2.0]))
    proj.add(1, 1, 50.0, 6)
    view = proj.view(6, np.array([101.0, 50.0]))
    # request 0 (W=100 at k=5, 2 offsets) is 101 at h=0 then gone; request 1 grows from 50
    np.testing.assert_allclose(view, [[101, 0, 0, 0], [50, 51, 52, 53]])
    proj.remove(np.array([1]))
    np.testing.assert_allclose(proj.view(6, np.array([101.0, 0.0]))[1], [0, 0, 0, 0])


@settings(max_examples=100, deadline=None)
@given(
    workload=st.lists(st.integers(1, 20_000), min_size=0, max_size=40),
    admitted=st.lists(st.integers(1, 20_000), max_size=4),
    refill=st.one_of(st.none(), st.floats(1, 5000)),
    seed=st.integers(0, 1000),
)
def test_none_projects_the_loads_as_they_are(workload, admitted, refill, seed):
    """What lets BR-H with ``none`` skip the projection: ``none``'s cutoff (the whole window)
    gives each rank its load now plus one token per running request per offset, refill or
    not, with the requests admitted since the rebuild counted the same way."""
    rng = np.random.default_rng(seed)
    g, horizon = 4, 12
    n = len(workload)
    workers = rng.integers(0, g, n)
    proj = LoadProjection(g, horizon, 1, n + len(admitted))
    proj.rebuild_cutoff(7, np.arange(n), workers, np.asarray(workload), np.full(n, float(horizon)),
                        refill)  # fmt: skip
    loads = np.bincount(workers, weights=np.asarray(workload, dtype=float), minlength=g)
    active = np.bincount(workers, minlength=g).astype(float)
    for i, prompt in enumerate(admitted):
        w = int(rng.integers(0, g))
        proj.add(n + i, w, float(prompt), 7)
        loads[w] += prompt
        active[w] += 1
    none = loads[:, None] + active[:, None] * np.arange(horizon + 1)
    np.testing.assert_array_equal(proj.view(7, loads), none)


def test_config_rejects_bad_values_and_unknown_options():
    from balanceroute.features.errors import UserError

    with pytest.raises(UserError, match="gamma"):
        BalanceRouteConfig(gamma=1.5)
    with pytest.raises(UserError, match="unknown brh option"):
        BRHPolicy(bogus=1)


def test_auto_projection_is_each_estimators_own():
    """auto: survival curves for the learned estimators, cutoffs for point predictions."""
    from balanceroute.predict.exactmatch import ExactMatchEstimator
    from balanceroute.predict.gbdt import GBDTEstimator
    from balanceroute.predict.no_prediction import NoPrediction
    from balanceroute.predict.noisy_oracle import NoisyOracleEstimator
    from balanceroute.predict.survival import SurvivalEstimator
    from balanceroute.router.policies.balance_route import resolve_projection

    for cls in (SurvivalEstimator, ExactMatchEstimator, GBDTEstimator):
        assert resolve_projection("auto", cls()) == "expected", cls.name
    for est in (OracleEstimator(), NoisyOracleEstimator(), NoPrediction(), None):
        assert resolve_projection("auto", est) == "cutoff"
    assert resolve_projection("cutoff", SurvivalEstimator()) == "cutoff"
    assert BRHPolicy().config.projection == "auto"


def test_auto_projection_replays_like_the_explicit_one():
    """brh with a learned estimator under auto makes the decisions of projection=expected."""
    from balanceroute.predict.survival import SurvivalEstimator

    rng = np.random.default_rng(4)
    prompts, outputs = rng.integers(50, 3000, 400), rng.integers(1, 300, 400)
    history = frame(rng.integers(50, 3000, 300), rng.integers(1, 300, 300))
    rq = released(prompts, outputs)
    runs = {}
    for proj in ("auto", "expected", "cutoff"):
        est = SurvivalEstimator(horizon=16).fit(history)
        pol = BRHPolicy(estimator=est, horizon=16, projection=proj, guard=False)
        res = simulate(rq, pol, SimConfig(workers=4, slots=8, record_loads=False))
        runs[proj] = (res.worker.tolist(), res.admit_iter.tolist())
        if proj == "auto":
            assert res.policy["projection_used"] == "expected"
    assert runs["auto"] == runs["expected"]
    assert runs["auto"] != runs["cutoff"]  # the two projections do decide differently here


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 200_000), min_size=1, max_size=80))
def test_small_median_is_numpys(prompts: list[int]) -> None:
    """The step's median of the waiting prompts equals ``np.median``, odd and even sizes."""
    from balanceroute.features.stats import small_median

    values = np.asarray(prompts, dtype=np.float64)
    assert small_median(values) == float(np.median(values))

"""The decode group's twin: the blend hook, the sequential test and its hysteresis, the
leakage-free shadow estimator, causality, and the A/B schedule."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.lab.twin.config import Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.driver import TwinDriver
from balanceroute.router.lab.twin.schedule import ScheduleEntry, scheduled_weight, twin_schedule
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.lab.twin.shadow import ShadowEstimator
from balanceroute.router.policies.balance_route import BRHPolicy
from balanceroute.router.policies.specs import RouterSpec
from tests.router.helpers import frame, released

CANDIDATES = (0.0, 0.5, 1.0)
CFG = TwinConfig(candidates=CANDIDATES, min_windows=6, cooldown=3, memory=40, z=2.0)


def _history():
    rng = np.random.default_rng(7)
    return frame(rng.integers(100, 3000, 400), rng.integers(1, 120, 400))


def _requests(n=600, seed=6):
    rng = np.random.default_rng(seed)
    return rng.integers(100, 3000, n), rng.integers(1, 120, n)


# ---- the blend hook ------------------------------------------------------------------------
def _run(estimator, **options):
    prompts, outputs = _requests()
    pol = BRHPolicy(estimator=estimator, horizon=16, **options)
    return simulate(released(prompts, outputs), pol, SimConfig(workers=3, slots=6))


def test_blend_zero_is_no_prediction_and_blend_one_is_the_estimator():
    def est():
        return SurvivalEstimator(horizon=16).fit(_history())  # fresh: a run teaches it

    zero, none = _run(est(), blend=0.0), _run(None)
    np.testing.assert_array_equal(zero.worker, none.worker)
    np.testing.assert_array_equal(zero.admit_iter, none.admit_iter)
    one, raw = _run(est(), blend=1.0), _run(est(), twin=False, guard=False)
    np.testing.assert_array_equal(one.worker, raw.worker)
    np.testing.assert_array_equal(one.admit_iter, raw.admit_iter)


def test_which_policies_a_twin_drives_and_that_it_starts_without_prediction():
    est = SurvivalEstimator(horizon=16).fit(_history())
    assert BRHPolicy(estimator=est, horizon=16).twin_managed
    assert not BRHPolicy(estimator=est, horizon=16, twin=False).twin_managed
    assert not BRHPolicy(estimator=est, horizon=16, blend=0.5).twin_managed
    assert not BRHPolicy(estimator=None, horizon=16).twin_managed
    prompts, outputs = _requests()
    rel = released(prompts, outputs)
    spec = RouterSpec.parse("brh:survival{horizon=16}")
    group = TwinGroup(spec, workers=3, slots=6)
    cfg = TwinConfig(candidates=CANDIDATES, block_requests=10**6)  # never decides
    driver = TwinDriver(spec.build_policy(est), DecodeTwin(group, est, cfg), rel)
    res = simulate(rel, driver, SimConfig(workers=3, slots=6))
    assert driver.inner.guard is None and "guard_weight" not in res.extras
    none = _run(None)
    np.testing.assert_array_equal(res.worker, none.worker)
    np.testing.assert_array_equal(res.admit_iter, none.admit_iter)
    assert res.extras["twin_weight_mean"] == 0.0 and res.extras["twin_decisions"] == 0


# ---- the sequential test -------------------------------------------------------------------
def test_no_switch_before_enough_blocks_then_a_clear_winner_is_taken():
    t = SequentialTest(CANDIDATES, CFG)
    rng = np.random.default_rng(0)
    for i in range(CFG.min_windows - 1):
        t.add(np.array([100.0, 95.0, 90.0]) * np.exp(rng.normal(0, 0.01, 3)))
        assert t.weight == 0.0, i
    t.add(np.array([100.0, 95.0, 90.0]))
    assert t.weight == 1.0 and t.switches == 1


@given(st.lists(st.floats(1.0, 1e6), min_size=1, max_size=80))
@settings(max_examples=100, deadline=None)
def test_equal_candidates_never_move_the_weight(values):
    t = SequentialTest(CANDIDATES, CFG)
    for v in values:
        t.add(np.full(len(CANDIDATES), v))
    assert t.weight == CFG.start_weight and t.switches == 0


@given(st.integers(0, 2**31), st.floats(0.0, 0.3))
@settings(max_examples=60, deadline=None)
def test_hysteresis_no_flip_back_without_evidence_against_the_new_weight(seed, noise):
    """After switching to a better weight, blocks where the candidates tie never switch back
    (the old weight would have to be significantly better), and switches respect the
    cooldown."""
    rng = np.random.default_rng(seed)
    t = SequentialTest(CANDIDATES, CFG)
    for _ in range(20):
        t.add(np.array([100.0, 97.0, 93.0]) * np.exp(rng.normal(0, 0.005, 3)))
    assert t.weight == 1.0
    for _ in range(60):
        t.add(np.full(3, 100.0 * np.exp(rng.normal(0, noise))))
    assert t.weight == 1.0 and t.switches == 1


def test_switches_back_when_the_chosen_weight_turns_harmful():
    t = SequentialTest(CANDIDATES, CFG)
    for _ in range(10):
        t.add(np.array([100.0, 97.0, 93.0]))
    assert t.weight == 1.0
    for _ in range(CFG.memory):
        t.add(np.array([100.0, 105.0, 115.0]))
    assert t.weight == 0.0


# ---- leakage, survivorship, causality ------------------------------------------------------
class Recording(SurvivalEstimator):
    """A learning estimator that remembers every prompt it was taught."""

    def observe(self, completions):
        self.taught = getattr(self, "taught", set()) | set(completions.prompt_tokens.tolist())
        super().observe(completions)


def _finished(idx, release, finish, prompts=None, outputs=None):
    n = len(idx)
    return Finished(
        np.asarray(idx, dtype=np.int64),
        np.asarray(release, dtype=float),
        np.asarray(prompts if prompts is not None else 100_000 + np.asarray(idx), dtype=np.int64),
        np.zeros(n, dtype=np.uint64),
        np.asarray(idx, dtype=np.int64),
        np.asarray(outputs if outputs is not None else np.full(n, 20), dtype=np.int64),
        np.asarray(finish, dtype=float),
    )


def test_shadow_learns_only_what_finished_before_and_snapshots_are_copies():
    est = Recording(horizon=16).fit(_history())
    before = set(getattr(est, "taught", set()))
    shadow = ShadowEstimator(est)
    shadow.finished(_finished([0, 1, 2], [0, 0, 1], [5.0, 9.0, 12.0]))
    shadow.advance_to(9.0)  # strictly before: only the first
    assert shadow.model.taught - before == {100_000}
    snap = shadow.snapshot()
    snap.observe(_as_batch(_finished([7], [0], [1.0], prompts=[94_242])))
    assert 94_242 not in shadow.model.taught
    assert getattr(est, "taught", set()) == before  # the live estimator is untouched


def _as_batch(f):
    from balanceroute.predict.base import CompletedBatch

    return CompletedBatch(f.prompt_tokens, f.output_tokens, f.prompt_key, f.finish_s)


def test_a_block_is_replayed_only_when_all_of_it_finished_and_never_with_its_own_requests(
    monkeypatch,
):
    est = Recording(horizon=16).fit(_history())
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), workers=2, slots=4)
    twin = DecodeTwin(group, est, TwinConfig(candidates=CANDIDATES, block_requests=10, overlap=1))
    seen = []
    original = DecodeTwin._replay

    def spy(self, rel, w):
        seen.append((self.next_block - 1, set(getattr(self.shadow.model, "taught", set()))))
        return original(self, rel, w)

    monkeypatch.setattr(DecodeTwin, "_replay", spy)
    rng = np.random.default_rng(3)
    prompts = 50_000 + np.arange(30)  # unique prompts identify requests
    release = np.sort(rng.uniform(0, 30, 30))
    outputs = rng.integers(5, 40, 30)
    finish = release + outputs * 0.05
    order = np.argsort(finish)
    for i in order[:-1]:
        twin.observe(_finished([i], [release[i]], [finish[i]], [prompts[i]], [outputs[i]]))
    last = int(order[-1])
    assert not (twin.ready() and last // 10 == twin.next_block)  # its block waits for it
    twin.observe(
        _finished([last], [release[last]], [finish[last]], [prompts[last]], [outputs[last]])
    )
    while twin.ready():
        twin.step()
    assert twin.next_block == 3 and seen
    for block, taught in seen:
        mine = set(prompts[block * 10 : (block + 1) * 10].tolist())
        assert not mine & taught  # never learned the requests it replays
        start = release[block * 10]
        later = {int(p) for p, f in zip(prompts, finish, strict=True) if f >= start}
        assert not later & taught  # nor any that finished after the block began


def test_the_twin_decides_from_the_past_only():
    """Two runs identical up to some block but different afterwards take the same decisions
    on the common blocks."""
    est = SurvivalEstimator(horizon=16).fit(_history())
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), workers=2, slots=4)
    cfg = TwinConfig(candidates=CANDIDATES, block_requests=20, min_windows=2, cooldown=1, overlap=1)
    rng = np.random.default_rng(5)
    prompts, outputs = rng.integers(100, 3000, 120), rng.integers(1, 120, 120)
    rel = np.zeros(120)

    def decisions(outs):
        twin = DecodeTwin(group, est, cfg)
        twin.observe(_finished(np.arange(120), rel, np.full(120, np.inf), prompts, outs))
        out = []
        while twin.ready():
            twin.step()
            out.append((twin.weight, twin.test.mean_log_ratios()))
        return out

    other = outputs.copy()
    other[80:] = rng.integers(1, 120, 40)
    a, b = decisions(outputs), decisions(other)
    assert a[:4] == b[:4]
    assert len(a) == len(b) == 6


def test_the_schedule_is_causal_and_the_driver_reports_its_work():
    entries = [ScheduleEntry(40, 0.5, 3, 1), ScheduleEntry(60, 1.0, 4, 2)]
    assert scheduled_weight(entries, 39, 0.0)[0] == 0.0
    assert scheduled_weight(entries, 40, 0.0)[0] == 0.5
    assert scheduled_weight(entries, 1000, 0.0)[0] == 1.0
    est = SurvivalEstimator(horizon=16).fit(_history())
    spec = RouterSpec.parse("brh:survival{horizon=16}")
    prompts, outputs = _requests(300)
    rel = released(prompts, outputs)
    group = TwinGroup(spec, workers=3, slots=6)
    cfg = TwinConfig(candidates=CANDIDATES, block_requests=36, overlap=2)
    entries, stats = twin_schedule(group, est, rel, cfg)
    # blocks of 36 every 18 arrivals; each decision known a block after its block's end
    assert [e.known_from for e in entries] == [18 * b + 72 for b in range(len(entries))]
    assert len(entries) == (300 - 36) // 18 + 1
    assert stats["twin_decisions"] + stats["twin_blocks_skipped"] == len(entries)
    pol = spec.build_policy(est)
    driver = TwinDriver(pol, DecodeTwin(group, est, cfg), rel)
    res = simulate(rel, driver, SimConfig(workers=3, slots=6))
    assert res.extras["twin_decisions"] >= 1 and res.extras["twin_iterations"] > 0
    assert res.extras["twin_cpu_s"] >= 0.0 and res.extras["twin_weight_mean"] is not None


def test_a_twin_behind_its_traffic_skips_to_the_newest_complete_block():
    est = SurvivalEstimator(horizon=16).fit(_history())
    group = TwinGroup(RouterSpec.parse("brh:survival{horizon=16}"), workers=2, slots=4)
    cfg = TwinConfig(candidates=CANDIDATES, block_requests=20, overlap=1)
    prompts, outputs = _requests(70)
    twin = DecodeTwin(group, est, cfg)
    twin.observe(_finished(np.arange(70), np.zeros(70), np.full(70, np.inf), prompts, outputs))
    assert twin.step(latest=True) > 0
    assert twin.next_block == 3 and twin.stats()["twin_blocks_dropped"] == 2
    assert not twin.ready() and twin.step(latest=True) == 0  # 60..69 is not a whole block

"""The twin's warm start: leakage-free (its estimator fits only on requests before the blocks
it replays), causal, and the replay starts at the weight the warm-up decided."""

from __future__ import annotations

import numpy as np
import pandas as pd

from balanceroute.predict.survival import SurvivalEstimator
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, released_requests, simulate_workload
from balanceroute.router.lab.twin import warmup as twin_warmup
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.schedule import scheduled_weight, twin_schedule
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.lab.twin.warmup import warm_split, warm_start, warm_up
from balanceroute.router.policies.specs import RouterSpec
from tests.router.helpers import frame, released

CANDIDATES = (0.0, 0.5, 1.0)
CFG = TwinConfig(
    candidates=CANDIDATES, block_requests=36, overlap=2, min_windows=2, cooldown=1, warm_start=0.6
)
SPEC = RouterSpec.parse("brh:survival{horizon=16}")


def _trace(n: int = 300, seed: int = 5) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    arrivals = np.sort(rng.uniform(0, 100, n))  # distinct: an arrival time names a request
    return frame(rng.integers(100, 3000, n), rng.integers(1, 120, n), arrivals)


def _replay_spec(spec: RouterSpec = SPEC) -> ReplaySpec:
    return ReplaySpec(router=spec, workers=3, slots=6, prefill=PrefillConfig(saturate=True))


def test_the_warm_up_estimator_fits_only_on_requests_before_the_blocks_it_replays(monkeypatch):
    history = _trace()
    seen: dict[str, pd.DataFrame] = {}
    real = twin_warmup.build_estimator

    def spy(spec, *, history=None, replay=None, horizon=None):
        seen["fit"], seen["replay"] = history, replay
        return real(spec, history=history, replay=replay, horizon=horizon)

    monkeypatch.setattr(twin_warmup, "build_estimator", spy)
    warm = warm_start(history, _replay_spec(), CFG, horizon=16)
    assert warm is not None
    fitted = set(seen["fit"]["arrival_s"].round(9))
    cut = round(len(history) * (1 - CFG.warm_start))
    assert fitted == set(history["arrival_s"].iloc[:cut].round(9))  # the earliest 40%, only
    replayed = set((seen["replay"]["arrival_s"] + history["arrival_s"].iloc[cut]).round(9))
    assert replayed == set(history["arrival_s"].iloc[cut:].round(9))
    assert not fitted & replayed
    assert warm.fit_last_arrival_s < warm.warm_first_arrival_s
    assert (warm.fit_requests, warm.warm_requests) == (cut, len(history) - cut)
    assert warm.stats()["twin_warm_blocks"] == warm.test.decisions == (180 - 36) // 18 + 1


def test_no_warm_start_without_history_or_for_a_registered_model_or_when_off():
    history = _trace()
    assert warm_start(None, _replay_spec(), CFG, 16) is None
    off = TwinConfig(candidates=CANDIDATES, warm_start=0.0)
    assert warm_start(history, _replay_spec(), off, 16) is None
    registered = RouterSpec.parse("brh:survival@models:/x/1")
    assert warm_start(history, _replay_spec(registered), CFG, 16) is None
    assert warm_split(history.iloc[:1], 0.5) is None


def test_the_replay_starts_at_the_warm_up_decision():
    history = _trace()
    split = warm_split(history, CFG.warm_start)
    est = SurvivalEstimator(horizon=16).fit(split.fit)
    group = TwinGroup(SPEC, workers=3, slots=6)
    rel, _ = released_requests(split.warm, _replay_spec())
    test = warm_up(group, est, rel, CFG)
    assert test.decisions > 0
    assert warm_start(history, _replay_spec(), CFG, 16).test.weight == test.weight
    # a forced decision, so that the start weight is not simply the default w = 0
    forced = SequentialTest(CANDIDATES, CFG)
    for _ in range(4):
        forced.add(np.array([1.0, 0.8, 0.6]))
    assert forced.weight == 1.0
    twin = DecodeTwin(group, est, CFG, warm=forced)
    assert twin.weight == 1.0 and twin.test is not forced  # a copy: the warm-up stays as it was
    prompts, outputs = _trace(100, seed=9)[["prompt_tokens", "output_tokens"]].T.to_numpy()
    entries, stats = twin_schedule(group, est, released(prompts, outputs), CFG, warm=forced)
    assert entries[0].known_from == 0 and entries[0].weight == 1.0
    assert scheduled_weight(entries, 0, 0.0)[0] == 1.0
    assert stats["twin_decisions"] >= forced.decisions


def test_a_window_weight_depends_only_on_requests_before_it():
    history = _trace()
    warm = warm_start(history, _replay_spec(), CFG, 16)
    est = SurvivalEstimator(horizon=16).fit(history)
    group = TwinGroup(SPEC, workers=3, slots=6)
    rng = np.random.default_rng(3)
    prompts, outputs = rng.integers(100, 3000, 300), rng.integers(1, 120, 300)
    other = outputs.copy()
    other[150:] = rng.integers(1, 120, 150)  # a different future from arrival 150 on
    a, _ = twin_schedule(group, est, released(prompts, outputs), CFG, warm=warm.test)
    b, _ = twin_schedule(group, est, released(prompts, other), CFG, warm=warm.test)
    for start in range(0, 151, 10):
        assert scheduled_weight(a, start, 0.0) == scheduled_weight(b, start, 0.0)
    assert scheduled_weight(a, 0, 0.0)[0] == warm.test.weight


def test_simulate_warms_the_live_twin_up_on_the_training_portion(tmp_path):
    trace = _trace(600)
    spec = _replay_spec(RouterSpec.parse("brh:survival{horizon=16;twin_warm=0.6}"))
    summary = simulate_workload(trace, {"kind": "test"}, spec, tmp_path / "a", train_fraction=0.5)
    assert summary["twin_warm_fit_requests"] == 120 and summary["twin_warm_requests"] == 180
    assert summary["twin_warm_blocks"] >= 1
    assert summary["twin_decisions"] >= summary["twin_warm_blocks"]  # the live twin continues
    off = _replay_spec(RouterSpec.parse("brh:survival{horizon=16;twin_warm=0}"))
    summary = simulate_workload(trace, {"kind": "test"}, off, tmp_path / "b", train_fraction=0.5)
    assert "twin_warm_blocks" not in summary

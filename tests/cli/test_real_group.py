"""``real-group``'s simulator side: the replay's figures over the window the engine's are taken."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from balanceroute.cli.real_group import headline, sim_figures
from balanceroute.features.loaders import load_trace
from balanceroute.router.lab.cost import cost_preset
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.replay_spec import ReplaySpec
from balanceroute.router.lab.runner import replay
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.testbed.realgroup.ab import FULL_SHARE, fidelity, occupancy


def test_the_saturated_window_counts_the_tokens_made_up_to_the_last_admission(tmp_path: Path):
    path = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": [0.0] * 4, "prompt_tokens": [10] * 4,
                  "output_tokens": [2, 5, 3, 3]}).to_csv(path, index=False)  # fmt: skip
    spec = ReplaySpec(router=RouterSpec.parse("count-jsq"), workers=1, slots=2,
                      cost=cost_preset("unit"), prefill=PrefillConfig(saturate=True))  # fmt: skip
    result, _ = replay(load_trace(path), spec)
    figures = sim_figures(result)
    last = int(result.admit_iter.max())
    # each request's tokens made in iterations 0..last: admitted at a, it makes one per iteration
    pairs = zip(result.admit_iter, result.output_tokens, strict=True)
    made = sum(min(a + o, last + 1) - a for a, o in pairs)
    window = result.t_start[last + 1] - result.t_start[0]
    assert figures["saturated_throughput_tok_s"] == pytest.approx(made / window)
    assert figures["throughput_tok_s"] == pytest.approx(13 / result.t_start[-1])
    assert made < 13


def test_the_headline_reports_saturated_whole_run_client_and_simulated_ratios():
    ratio = {"ratio": 0.7, "low": 0.6, "high": 0.8}
    keys = ("saturated_imbalance_tokens", "saturated_throughput_tok_s", "imbalance_tokens",
            "throughput_tok_s")  # fmt: skip
    table = {"brh:none": {**{f"engine.{k}": ratio for k in keys}, "client.output_throughput": None}}
    sim = {"brh:none": {f"engine.{k}": {**ratio, "ratio": 0.9} for k in keys}}
    line = headline({"ranks": 2}, table, sim, holds=True)
    arm = line["arms"]["brh:none"]
    assert arm["imbalance_ratio"] == {"mean": 0.7, "low": 0.6, "high": 0.8}
    assert arm["client_throughput_ratio"] is None
    assert arm["emulated_imbalance_ratio"] == 0.9 and line["lockstep"] is True
    assert arm["simulated_imbalance_ratio"] == 0.9 and line["emulated_by"] == "simulator"


def test_the_emulator_study_gives_the_emulated_ratios_a_learned_arm_matched_without_its_file():
    ratio = {"ratio": 0.7, "low": 0.6, "high": 0.8}
    keys = ("saturated_imbalance_tokens", "saturated_throughput_tok_s", "imbalance_tokens",
            "throughput_tok_s")  # fmt: skip
    engine_row = {**{f"engine.{k}": ratio for k in keys}, "client.output_throughput": None}
    table = {"brh:none": engine_row, "brh:gbdt@/run/model-gbdt.joblib": engine_row}
    sim = {a: {f"engine.{k}": {**ratio, "ratio": 0.5} for k in keys} for a in table}
    emulated = {"brh:none": {"engine.saturated_imbalance_tokens": {**ratio, "ratio": 0.8},
                             "engine.saturated_throughput_tok_s": {**ratio, "ratio": 1.05}},
                "brh:gbdt@/emu/model-gbdt.joblib": {
                    "engine.saturated_imbalance_tokens": {**ratio, "ratio": 0.85}}}  # fmt: skip
    line = headline({"ranks": 2}, table, sim, holds=True, emulated=emulated)
    arms = line["arms"]
    assert arms["brh:none"]["emulated_imbalance_ratio"] == 0.8
    assert arms["brh:none"]["emulated_throughput_ratio"] == 1.05
    assert arms["brh:gbdt@/run/model-gbdt.joblib"]["emulated_imbalance_ratio"] == 0.85
    assert arms["brh:gbdt@/run/model-gbdt.joblib"]["emulated_throughput_ratio"] is None
    assert arms["brh:none"]["simulated_imbalance_ratio"] == 0.5
    assert line["emulated_by"] == "emulator"


def test_occupancy_is_the_share_of_the_slots_held_while_requests_waited():
    records = [{"arm": "count-jsq", "engine": {"saturated_running": 15.0}},
               {"arm": "brh:none", "engine": {"saturated_running": 9.6}},
               {"arm": "brh:none", "engine": {"saturated_running": float("nan")}},
               # an arm that holds slots free by design is not counted
               {"arm": "brh:none{prefill_align=8}", "engine": {"saturated_running": 2.0}}]  # fmt: skip
    held = occupancy(records, 16)
    assert held["min"] == pytest.approx(0.6) and held["mean"] == pytest.approx((15 + 9.6) / 32)
    assert held["min"] < FULL_SHARE <= occupancy(records[:1], 16)["min"]
    line = headline({"ranks": 2}, {}, {}, holds=True, held=held)
    assert line["occupancy"] == held


def test_fidelity_is_the_simulators_mean_over_the_engines_per_arm():
    def rec(arm, repeat, imbalance, throughput):
        return {"arm": arm, "repeat": repeat, "engine": {"saturated_imbalance_tokens": imbalance,
                                                         "saturated_throughput_tok_s": throughput}}
    engine = [rec("count-jsq", 0, 4000, 400), rec("count-jsq", 1, 6000, 500),
              rec("brh:none", 0, 1000, 420), rec("brh:none", 1, 3000, 480)]  # fmt: skip
    sim = [rec("count-jsq", 0, 5000, 450), rec("count-jsq", 1, 5000, 450),
           rec("brh:none", 0, 1000, 450), rec("brh:none", 1, 1000, 450)]  # fmt: skip
    got = fidelity(engine, sim, ("count-jsq", "brh:none"))
    assert got["count-jsq"]["saturated_imbalance_tokens"] == pytest.approx(1.0)
    assert got["brh:none"]["saturated_imbalance_tokens"] == pytest.approx(0.5)
    assert got["brh:none"]["saturated_throughput_tok_s"] == pytest.approx(1.0)

"""Synthetic presets: their statistics hit the published targets, and a seed fixes the frame."""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.features.schema import validate_trace
from balanceroute.features.stats import trace_stats
from balanceroute.features.synthetic import PRESETS, generate, get_preset, preset_names

N = 50_000
# preset -> (prompt mean, output mean) targets
TARGETS = {
    "paper-prod": (3_197, 1_185),
    "azure-conv": (1_155, 211),
    "mooncake-conv": (12_035, 343),
    "geometric": (1_024.5, 256),
    "code-completion": (3_000, 40),
    # azure-conv, then outputs clipped at 1,000 more often once they spread wider: 200 then 180
    "azure-drift": (1_155, 190),
}


@pytest.fixture(scope="module")
def traces() -> dict[str, pd.DataFrame]:
    return {name: generate(name, N, seed=0) for name in preset_names()}


def test_every_preset_has_targets():
    assert set(TARGETS) == set(PRESETS)


@pytest.mark.parametrize("name", list(TARGETS))
def test_means_within_ten_percent(traces, name):
    prompt, output = TARGETS[name]
    trace = traces[name]
    assert trace["prompt_tokens"].mean() == pytest.approx(prompt, rel=0.1)
    assert trace["output_tokens"].mean() == pytest.approx(output, rel=0.1)


@pytest.mark.parametrize("name", ["paper-prod", "azure-conv", "mooncake-conv", "code-completion"])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_means_hold_for_other_seeds(name, seed):
    prompt, output = TARGETS[name]
    trace = generate(name, 20_000, seed=seed)
    assert trace["prompt_tokens"].mean() == pytest.approx(prompt, rel=0.1)
    assert trace["output_tokens"].mean() == pytest.approx(output, rel=0.1)


@pytest.mark.parametrize("name", list(TARGETS))
def test_frames_are_canonical_and_arrive_at_the_preset_rate(traces, name):
    trace = traces[name]
    pd.testing.assert_frame_equal(validate_trace(trace), trace)
    rate = trace_stats(trace)["arrivals"]["mean_rate_rps"]
    assert rate == pytest.approx(get_preset(name).arrivals.rate, rel=0.01)


def test_paper_prod_has_a_long_tail_and_key_signal(traces):
    stats = trace_stats(traces["paper-prod"])
    output = stats["output_tokens"]
    assert output["std"] == pytest.approx(1_400, rel=0.15)
    assert stats["prompt_tokens"]["std"] == pytest.approx(2_500, rel=0.15)
    assert output["p99"] > 4 * output["mean"]
    assert stats["keys"]["within_key_output_std"] < 0.6 * output["std"]


def test_azure_conv_matches_the_real_trace_shape(traces):
    trace = traces["azure-conv"]
    stats = trace_stats(trace)
    assert stats["prompt_tokens"]["median"] == pytest.approx(1_020, rel=0.1)
    assert stats["output_tokens"]["median"] == pytest.approx(129, rel=0.1)
    assert stats["output_tokens"]["max"] <= 1_000
    assert 10_000 <= stats["prompt_tokens"]["max"] <= 14_050
    assert stats["keys"]["recurring_share"] == pytest.approx(0.95, abs=0.02)
    assert stats["keys"]["within_key_output_std"] == pytest.approx(57, rel=0.2)
    assert stats["keys"]["output_std"] == pytest.approx(163, rel=0.1)
    templated = trace[~trace["prompt_key"].str.startswith("once-")]
    assert (templated.groupby("prompt_key")["prompt_tokens"].nunique() == 1).all()


def test_mooncake_conv_keys_look_like_prefix_blocks(traces):
    trace = traces["mooncake-conv"]
    assert trace["prompt_key"].str.fullmatch(r"0-\d+").all()
    assert trace_stats(trace)["keys"]["recurring_share"] == pytest.approx(0.57, abs=0.03)
    assert np.all(np.mod(trace["arrival_s"], 3.0) == 0)


def test_geometric_is_the_theorem_regime(traces):
    trace = traces["geometric"]
    assert trace["prompt_key"].isna().all()
    assert trace["prompt_tokens"].between(1, 2048).all()
    assert trace["output_tokens"].min() >= 1
    custom = dataclasses.replace(get_preset("geometric"), max_prompt=100, mean_output=10.0)
    small = generate(custom, 20_000, seed=3)
    assert small["prompt_tokens"].max() == 100
    assert small["output_tokens"].mean() == pytest.approx(10, rel=0.05)


@pytest.mark.parametrize("name", list(TARGETS))
def test_same_seed_same_frame_other_seed_other_frame(name):
    first = generate(name, 2_000, seed=7)
    pd.testing.assert_frame_equal(first, generate(name, 2_000, seed=7))
    assert not first.equals(generate(name, 2_000, seed=8))


def test_unknown_preset_lists_the_known_ones():
    with pytest.raises(UserError, match="unknown preset 'prod'; known presets: paper-prod, "):
        generate("prod", 10)


def test_request_count_must_be_positive():
    with pytest.raises(UserError, match="at least 1"):
        generate("paper-prod", 0)


def test_code_completion_outputs_are_short_next_to_the_horizon(traces):
    """A few thousand prompt tokens, a few dozen output tokens: short next to H."""
    trace = traces["code-completion"]
    assert 2_000 <= trace["prompt_tokens"].median() <= 4_000
    assert trace["output_tokens"].median() < 40
    assert (trace["output_tokens"] <= DEFAULT_HORIZON).mean() > 0.85
    assert trace["prompt_key"].duplicated(keep=False).mean() > 0.5  # files recur


def test_the_drift_preset_changes_the_output_law_half_way_and_nothing_else(traces):
    before, drift = traces["azure-conv"], traces["azure-drift"]
    half = N // 2
    pd.testing.assert_frame_equal(drift.iloc[:half], before.iloc[:half])
    pd.testing.assert_frame_equal(
        drift.iloc[half:].drop(columns="output_tokens"),
        before.iloc[half:].drop(columns="output_tokens"),
    )

    def within_key_std(frame: pd.DataFrame) -> float:
        return float(frame.groupby("prompt_key")["output_tokens"].std().mean())

    assert within_key_std(drift.iloc[half:]) > 2.5 * within_key_std(drift.iloc[:half])
    short = lambda frame: float((frame["output_tokens"] <= 80).mean())  # noqa: E731
    assert short(drift.iloc[half:]) > short(drift.iloc[:half]) + 0.1

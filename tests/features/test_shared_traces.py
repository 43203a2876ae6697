"""The public traces in ../shared/data load with the row counts and means their README quotes."""

from __future__ import annotations

import pytest

from balanceroute.features.loaders import detect_format, load_trace
from balanceroute.features.stats import trace_stats


def test_azure_2023_conversation(shared_data):
    path = shared_data / "azure_llm_2023_conv.csv"
    assert detect_format(path) == "azure"
    stats = trace_stats(load_trace(path))
    assert stats["rows"] == 19_366
    assert stats["prompt_tokens"]["mean"] == pytest.approx(1_155, abs=0.5)
    assert stats["prompt_tokens"]["median"] == 1_020
    assert stats["prompt_tokens"]["max"] == 14_050
    assert stats["output_tokens"]["mean"] == pytest.approx(211, abs=0.5)
    assert stats["output_tokens"]["median"] == 129
    assert stats["output_tokens"]["max"] == 1_000
    assert stats["keys"] is None
    assert stats["arrivals"]["span_s"] == pytest.approx(3_501.721937)


def test_azure_exact_prompt_length_behaves_like_a_key(shared_data):
    trace = load_trace(shared_data / "azure_llm_2023_conv.csv")
    keys = trace.assign(prompt_key=trace["prompt_tokens"].astype(str))
    stats = trace_stats(keys)["keys"]
    assert stats["recurring_share"] == pytest.approx(0.95, abs=0.005)
    assert stats["within_key_output_std"] == pytest.approx(57, abs=0.5)
    assert stats["output_std"] == pytest.approx(163, abs=0.5)


def test_mooncake_conversation(shared_data):
    path = shared_data / "mooncake_conversation.jsonl"
    assert detect_format(path) == "mooncake"
    trace = load_trace(path)
    stats = trace_stats(trace)
    assert stats["rows"] == 12_031
    assert stats["prompt_tokens"]["mean"] == pytest.approx(12_035, abs=0.5)
    assert stats["output_tokens"]["mean"] == pytest.approx(343, abs=0.5)
    assert stats["keys"]["recurring_share"] == pytest.approx(0.57, abs=0.005)
    assert trace["prompt_key"].iloc[:2].tolist() == ["0-1", "0-14"]


def test_limit_on_the_shared_traces(shared_data):
    assert len(load_trace(shared_data / "azure_llm_2023_conv.csv", limit=100)) == 100
    assert len(load_trace(shared_data / "mooncake_conversation.jsonl", limit=100)) == 100

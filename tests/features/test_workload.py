"""load_workload: a trace file when given, else a synthetic preset, with a source record."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from balanceroute.features.digest import file_sha256
from balanceroute.features.errors import UserError
from balanceroute.features.synthetic import generate
from balanceroute.features.workload import WorkloadSpec, load_workload
from tests.features.trace_fixtures import MOONCAKE


def test_defaults_to_ten_thousand_paper_prod_requests():
    frame, source = load_workload(WorkloadSpec(trace=None, preset=None, requests=None, seed=0))
    assert len(frame) == 10_000
    assert source["kind"] == "synthetic"
    assert source["preset"] == "paper-prod"
    assert source["rows"] == 10_000
    pd.testing.assert_frame_equal(frame, generate("paper-prod", 10_000, seed=0))
    json.dumps(source)


def test_preset_digest_follows_the_content():
    _, a = load_workload(WorkloadSpec(trace=None, preset="geometric", requests=100, seed=1))
    _, b = load_workload(WorkloadSpec(trace=None, preset="geometric", requests=100, seed=1))
    _, c = load_workload(WorkloadSpec(trace=None, preset="geometric", requests=100, seed=2))
    assert a["sha256"] == b["sha256"] != c["sha256"]
    assert len(a["sha256"]) == 64
    assert a["params"]["max_prompt"] == 2048


def test_trace_file_with_a_request_limit(write):
    path = write("conv.jsonl", MOONCAKE)
    frame, source = load_workload(WorkloadSpec(trace=str(path), preset=None, requests=2, seed=0))
    assert len(frame) == 2
    assert source == {
        "kind": "trace",
        "path": str(path.resolve()),
        "format": "mooncake",
        "key_blocks": 2,
        "limit": 2,
        "rows": 2,
        "sha256": file_sha256(path),
    }


def test_trace_and_preset_together_is_an_error(write):
    path = write("conv.jsonl", MOONCAKE)
    with pytest.raises(UserError, match="not both"):
        load_workload(WorkloadSpec(trace=str(path), preset="geometric", requests=None, seed=0))


def test_bad_request_count_and_unknown_preset():
    with pytest.raises(UserError, match="at least 1"):
        load_workload(WorkloadSpec(trace=None, preset=None, requests=0, seed=0))
    with pytest.raises(UserError, match="known presets"):
        load_workload(WorkloadSpec(trace=None, preset="nope", requests=None, seed=0))

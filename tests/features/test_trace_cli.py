"""``balanceroute trace synth`` and ``balanceroute trace inspect`` on real files."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from balanceroute.features.loaders import load_trace
from balanceroute.features.synthetic import generate
from tests.features.trace_fixtures import BURSTGPT, MOONCAKE


def test_synth_writes_the_seeded_preset(tmp_path, cli):
    out = tmp_path / "azure.parquet"
    args = "trace synth --preset azure-conv --requests 300 --seed 4 --out".split()
    code, stdout, err = cli(*args, str(out))
    assert (code, err) == (0, "")
    assert "wrote 300 requests" in stdout
    pd.testing.assert_frame_equal(load_trace(out), generate("azure-conv", 300, seed=4))


def test_synth_bad_extension_is_one_line(tmp_path, cli):
    code, _, err = cli("trace", "synth", "--requests", "5", "--out", str(tmp_path / "t.txt"))
    assert code == 2
    assert err.count("\n") == 1 and "supported: .csv, .parquet, .jsonl" in err


def test_inspect_json(tmp_path, cli):
    path = tmp_path / "m.jsonl"
    path.write_text(MOONCAKE)
    code, stdout, err = cli("trace", "inspect", str(path), "--json", "--key-blocks", "3")
    assert (code, err) == (0, "")
    summary = json.loads(stdout)
    assert summary["format"] == "mooncake"
    assert summary["rows"] == 4
    assert summary["keys"]["distinct"] == 3
    assert summary["keys"]["recurring_share"] == pytest.approx(0.5)
    assert summary["arrivals"]["span_s"] == pytest.approx(6.5)
    assert set(summary["prompt_tokens"]) == {"mean", "std", "median", "p99", "max"}


def test_inspect_text(tmp_path, cli):
    path = tmp_path / "b.csv"
    path.write_text(BURSTGPT)
    code, stdout, err = cli("trace", "inspect", str(path), "--format", "burstgpt")
    assert code == 0
    assert err.strip() == (
        f"balanceroute trace inspect: warning: {path}: dropped 1 failed request(s) "
        "(Response tokens == 0), kept 3"
    )
    lines = stdout.splitlines()
    assert lines[0] == f"{path} (burstgpt): 3 requests"
    assert lines[1].startswith("prompt tokens  mean")
    assert lines[3] == "arrivals       span 115.0 s, mean rate 0.017 req/s"
    assert lines[-1] == "prompt keys    none"

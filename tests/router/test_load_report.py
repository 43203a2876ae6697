"""``--load`` on prefill-bound traffic: the summary reports the achieved decode load, a warning
says when it falls far short, and ``--prefill-instances auto`` sizes the prefill tier."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.cli import main
from balanceroute.features.trace_io import write_trace


def long_prompts(tmp_path: Path) -> Path:
    """Long prompts, short outputs: the prefill tier, not the decode tier, is the bottleneck."""
    n = 400
    rng = np.random.default_rng(0)
    frame = pd.DataFrame(
        {
            "arrival_s": np.sort(rng.uniform(0, 100, n)),
            "prompt_tokens": rng.integers(20_000, 30_000, n),
            "output_tokens": rng.integers(5, 20, n),
        }
    )
    return write_trace(frame, tmp_path / "long.csv")


def run(tmp_path: Path, capsys, *extra: str) -> tuple[dict, str]:
    out = tmp_path / f"run{len(list(tmp_path.iterdir()))}"
    args = ["simulate", "--trace", str(long_prompts(tmp_path)), "--workers", "4", "--slots", "8"]
    assert main([*args, "--load", "1.0", *extra, "--out", str(out)]) == 0
    return json.loads((out / "summary.json").read_text()), capsys.readouterr().err


def test_prefill_bound_load_is_reported_and_warned(tmp_path: Path, capsys) -> None:
    summary, err = run(tmp_path, capsys, "--prefill-instances", "1")
    load = summary["load"]
    assert load["offered_load"] == 1.0
    assert load["achieved_decode_load"] < 0.8
    assert "warning" in err and "--prefill-instances" in err


def test_prefill_instances_auto_reaches_the_offered_load(tmp_path: Path, capsys) -> None:
    summary, err = run(tmp_path, capsys, "--prefill-instances", "auto")
    load = summary["load"]
    assert load["prefill_instances"] > 1
    assert load["achieved_decode_load"] > 0.8
    assert "warning" not in err

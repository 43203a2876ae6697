"""Fitting the cost model to step logs, and the cost file it writes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from balanceroute.cli import build_parser, main
from balanceroute.cli.emulate import config_from_args
from balanceroute.features.errors import UserError
from balanceroute.router.lab.cost import (
    CostModel,
    cost_preset,
    read_cost_file,
    resolve_cost,
    write_cost_file,
)
from balanceroute.router.lab.cost_fit import fit_cost
from balanceroute.serving.testbed.realgroup.steplog import COLUMNS, read_steps

TRUE = CostModel(t_fixed_s=0.02, t_token_s=1e-6, t_prefill_s=2e-5, prefill_chunk_tokens=2048)


def write_step_logs(folder: Path, cost: CostModel, steps: int = 600, seed: int = 0) -> None:
    """Two ranks' step logs whose group steps last as ``cost`` says, with 2% noise, one idle
    spell (5 s before step 300) and ten dummy-only steps (after step 500)."""
    rng = np.random.default_rng(seed)
    kv = rng.integers(0, 30_000, (steps, 2))
    prefill = np.zeros((steps, 2), dtype=np.int64)
    chunked = rng.random(steps) < 0.2
    prefill[chunked, rng.integers(0, 2, steps)[chunked]] = rng.integers(1, 2049, chunked.sum())
    dummy = np.zeros(steps, dtype=bool)
    dummy[501:511] = True
    kv[dummy], prefill[dummy] = 0, 0
    duration = cost.step_time(kv, prefill) * np.exp(0.02 * rng.standard_normal(steps))
    gap = np.full(steps, 2e-4)
    gap[300:301] = 5.0  # (a short log has no idle spell)
    end = 1000.0 + np.cumsum(gap + duration)
    start = end - duration
    for rank in range(2):
        rows = {
            "rank": rank,
            "pass": np.arange(steps),
            "kind": np.where(dummy | (kv[:, rank] == 0), "dummy", "real"),
            "start_s": start + 1e-4 * rank,
            "end_s": end - 1e-4 * (1 - rank),
            "scheduled_tokens": prefill[:, rank] + 1,
            "prefill_tokens": prefill[:, rank],
            "decode_requests": 1,
            "running": 1,
            "waiting": 0,
            "kv_tokens": kv[:, rank],
            "new_tokens": 1,
            "comm_s": 0.0,
        }
        pd.DataFrame(rows)[list(COLUMNS)].to_csv(
            folder / f"steps-dp{rank}-{100 + rank}.csv", index=False
        )


def test_fit_recovers_known_coefficients_through_the_noise(tmp_path):
    write_step_logs(tmp_path, TRUE)
    fit = fit_cost(read_steps(tmp_path), source=str(tmp_path))
    assert fit.cost.t_fixed_s == pytest.approx(TRUE.t_fixed_s, rel=0.05)
    assert fit.cost.t_token_s == pytest.approx(TRUE.t_token_s, rel=0.05)
    assert fit.cost.t_prefill_s == pytest.approx(TRUE.t_prefill_s, rel=0.05)
    assert fit.left_out == {"first": 1, "no_real_pass": 10, "after_idle": 1}
    assert fit.steps == 600 - 12
    assert fit.r2 > 0.9
    assert fit.median_abs_rel_error < 0.03
    assert 0 < fit.prefill_steps < fit.steps


def test_fit_without_prefill_steps_leaves_the_prefill_term_off(tmp_path):
    decode_only = CostModel(t_fixed_s=0.01, t_token_s=2e-6)
    write_step_logs(tmp_path, decode_only)
    fit = fit_cost(read_steps(tmp_path))
    assert fit.cost.t_token_s == pytest.approx(2e-6, rel=0.05)
    assert fit.cost.t_prefill_s < 1e-7  # the prompt tokens cost nothing in these steps


def test_too_few_steps_is_a_user_error(tmp_path):
    write_step_logs(tmp_path, TRUE, steps=3)
    with pytest.raises(UserError, match="usable group steps"):
        fit_cost(read_steps(tmp_path))


def test_cost_file_round_trips(tmp_path):
    path = write_cost_file(tmp_path / "cost.json", TRUE, {"r2": 0.5, "source": "x"})
    assert read_cost_file(path) == TRUE
    assert resolve_cost(str(path)) == TRUE
    assert json.loads(path.read_text())["fit"] == {"r2": 0.5, "source": "x"}
    assert resolve_cost("unit") == cost_preset("unit")


GOOD = {"t_fixed_s": 0.01, "t_token_s": 1e-6, "t_prefill_s": 0.0, "t_comm_s": 0.0,
        "prefill_chunk_tokens": 2048}  # fmt: skip


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("{not json", "not JSON"),
        ("[1, 2]", "expected a JSON object"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "t_token_s"}), "missing keys t_token_s"),
        (json.dumps({**GOOD, "t_tokens_s": 1.0}), "unknown keys t_tokens_s"),
        (json.dumps({**GOOD, "t_fixed_s": -0.01}), "t_fixed_s must be finite and >= 0"),
        (json.dumps({**GOOD, "t_prefill_s": "fast"}), "t_prefill_s must be a number"),
        (json.dumps({**GOOD, "prefill_chunk_tokens": 0}), "prefill chunk must be"),
        (json.dumps({**GOOD, "prefill_chunk_tokens": 2.5}), "whole number"),
        (json.dumps({**GOOD, "t_fixed_s": 0.0, "t_token_s": 0.0}), "must take some time"),
    ],
)
def test_bad_cost_files_name_the_file_and_the_fault(tmp_path, text, fault):
    path = tmp_path / "cost.json"
    path.write_text(text)
    with pytest.raises(UserError, match=fault) as err:
        read_cost_file(path)
    assert str(path) in str(err.value)


def test_cost_names_neither_preset_nor_file_are_refused(tmp_path):
    with pytest.raises(UserError, match="neither a preset"):
        resolve_cost(str(tmp_path / "missing.json"))


def test_cli_fits_writes_and_simulate_takes_the_file(tmp_path, capsys):
    steps = tmp_path / "steps"
    steps.mkdir()
    write_step_logs(steps, TRUE)
    out = tmp_path / "cost.json"
    assert (
        main(["cost", "fit", "--steps", str(steps), "--out", str(out), "--prefill-chunk", "512"])
        == 0
    )
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    assert printed["prefill_chunk_tokens"] == 512 and printed["fit"]["steps"] == 588
    sim = tmp_path / "sim"
    args = ["simulate", "--requests", "200", "--workers", "2", "--slots", "4", "--saturate"]
    assert main([*args, "--cost", str(out), "--out", str(sim)]) == 0
    summary = json.loads((sim / "summary.json").read_text())
    assert summary["config"]["cost"]["t_prefill_s"] == pytest.approx(printed["t_prefill_s"])
    assert main([*args, "--cost", str(tmp_path / "nope.json"), "--out", str(sim / "x")]) == 2
    assert "neither a preset" in capsys.readouterr().err


def test_emulate_takes_a_cost_file(tmp_path):
    path = write_cost_file(tmp_path / "cost.json", TRUE)
    argv = ["emulate", "--cost", str(path), "--ranks", "2"]
    config = config_from_args(build_parser(argv).parse_args(argv))
    assert config.cost == TRUE and config.cost_name == str(path)

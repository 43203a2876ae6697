"""The real group's step logs: the ranks' passes joined into group steps, and a run's figures."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.errors import UserError
from balanceroute.serving.testbed.realgroup.steplog import COLUMNS, lockstep, measure, read_steps
from balanceroute.serving.testbed.realgroup.workload import SliceSpec, scaled, write_slices


def write_rank(folder: Path, rank: int, rows: list[dict], pid: int = 100) -> Path:
    """One rank's step log as the plugin writes it."""
    frame = pd.DataFrame([{**dict.fromkeys(COLUMNS, 0), "rank": rank, "pass": i, **r}
                          for i, r in enumerate(rows)])  # fmt: skip
    path = folder / f"steps-dp{rank}-{pid}.csv"
    frame[list(COLUMNS)].to_csv(path, index=False)
    return path


def step(start: float, end: float, kv: int, kind: str = "real", **more) -> dict:
    return {"kind": kind, "start_s": start, "end_s": end, "kv_tokens": kv, **more}


def test_the_ranks_passes_join_into_steps_and_a_run_measures_its_window(tmp_path: Path):
    # rank 0 holds 100, 110, 120 tokens over three steps; rank 1 holds 20, then sits idle
    write_rank(tmp_path, 0, [step(0.0, 1.0, 100, new_tokens=2), step(1.0, 1.5, 110, new_tokens=2),
                             step(1.5, 2.5, 120, new_tokens=2)])  # fmt: skip
    write_rank(tmp_path, 1, [step(0.0, 1.1, 20, new_tokens=1), step(1.1, 1.6, 0, kind="dummy"),
                             step(1.6, 2.4, 0, kind="dummy")])  # fmt: skip
    steps = read_steps(tmp_path)
    assert list(steps["step"]) == [0, 0, 1, 1, 2, 2]
    # group end is the last rank's; a step lasts from the previous step's end
    assert steps.drop_duplicates("step")["group_end_s"].tolist() == [1.1, 1.6, 2.5]
    assert np.allclose(steps.drop_duplicates("step")["duration_s"], [1.1, 0.5, 0.9])
    figures = measure(steps, 0.0, 10.0)
    assert figures.steps == 3
    # G max - sum: (200 - 120) + (220 - 110) + (240 - 120)
    assert figures.imbalance_tokens == pytest.approx((80 + 110 + 120) / 3)
    assert figures.tokens == 7
    assert figures.makespan_s == pytest.approx(2.5)
    # rank 1 sat in dummy passes for the last two steps: (0.5 + 0.9) of 2 x 2.5 rank-seconds
    assert figures.idle_share == pytest.approx(1.4 / 5.0)
    # a window that holds only the last step
    assert measure(steps, 2.0, 3.0).steps == 1
    with pytest.raises(UserError, match="no engine steps"):
        measure(steps, 5.0, 6.0)
    check = lockstep(tmp_path)
    assert check.holds and check.passes == (3, 3)


def test_a_rank_that_ran_fewer_passes_breaks_lockstep(tmp_path: Path):
    write_rank(tmp_path, 0, [step(0.0, 0.1 * (i + 1), 10) for i in range(4)])
    write_rank(tmp_path, 1, [step(0.0, 0.1 * (i + 1), 10) for i in range(3)])
    check = lockstep(tmp_path)
    assert check.passes == (4, 3) and not check.holds


def test_the_newest_process_of_a_rank_is_read(tmp_path: Path):
    import os

    old = write_rank(tmp_path, 0, [step(0.0, 1.0, 999)], pid=1)
    os.utime(old, (1, 1))
    write_rank(tmp_path, 0, [step(5.0, 6.0, 10)], pid=2)
    write_rank(tmp_path, 1, [step(5.0, 6.0, 10)], pid=3)
    assert read_steps(tmp_path)["kv_tokens"].tolist() == [10, 10]


def test_no_logs_and_foreign_files_are_clear_errors(tmp_path: Path):
    with pytest.raises(UserError, match="no step logs"):
        read_steps(tmp_path)
    (tmp_path / "steps-dp0-1.csv").write_text("a,b\n1,2\n")
    with pytest.raises(UserError, match="missing columns"):
        read_steps(tmp_path)


def test_slices_scale_prompts_and_outputs_into_the_context(tmp_path: Path):
    trace = tmp_path / "t.csv"
    pd.DataFrame({"arrival_s": np.arange(10.0), "prompt_tokens": [40_000] + [800] * 9,
                  "output_tokens": [7_000] + [100] * 9}).to_csv(trace, index=False)  # fmt: skip
    spec = SliceSpec(str(trace), repeats=2, requests=4, prompt_scale=0.25, output_scale=0.5,
                     max_model_len=8192, skip=2)  # fmt: skip
    frame = scaled(pd.read_csv(trace), spec)
    assert frame["prompt_tokens"].iloc[0] == 4095  # capped at half the context
    assert frame["prompt_tokens"].iloc[1] == 200 and frame["output_tokens"].iloc[1] == 50
    assert (frame["prompt_tokens"] + frame["output_tokens"] <= 8191).all()
    paths = write_slices(spec, tmp_path / "slices")
    parts = [pd.read_csv(p) for p in paths]
    assert [len(p) for p in parts] == [4, 4]
    assert (parts[0]["arrival_s"] == 0).all()
    assert len(pd.read_csv(tmp_path / "slices" / "history.csv")) == 2
    with pytest.raises(UserError, match="needed"):
        write_slices(SliceSpec(str(trace), repeats=3, requests=4), tmp_path / "x")


def test_the_saturated_window_ends_at_the_last_step_that_prefilled(tmp_path: Path):
    # step 1 is the last admission (rank 1 prefills 64 prompt tokens); steps 2-3 are the drain
    write_rank(tmp_path, 0, [step(0.0, 1.0, 100, new_tokens=1, prefill_tokens=32, running=3),
                             step(1.0, 2.0, 101, new_tokens=1, running=2),
                             step(2.0, 3.0, 102, new_tokens=1, running=1),
                             step(3.0, 7.0, 103, new_tokens=1, running=1)])  # fmt: skip
    write_rank(tmp_path, 1, [step(0.0, 1.0, 50, new_tokens=1, running=1),
                             step(1.0, 2.0, 64, new_tokens=0, prefill_tokens=64, running=2),
                             step(2.0, 3.0, 0, kind="dummy"), step(3.0, 7.0, 0, kind="dummy")])  # fmt: skip
    figures = measure(read_steps(tmp_path), 0.0, 10.0)
    assert figures.prefill_steps == 2 and figures.saturated_steps == 2
    # (200 - 150) and (202 - 165) while saturated; the drain adds (204 - 102) and (206 - 103)
    assert figures.saturated_imbalance_tokens == pytest.approx((50 + 37) / 2)
    assert figures.imbalance_tokens == pytest.approx((50 + 37 + 102 + 103) / 4)
    assert figures.saturated_throughput_tok_s == pytest.approx(3 / 2.0)
    assert figures.throughput_tok_s == pytest.approx(5 / 7.0)
    assert figures.prefill_share == pytest.approx(2 / 7.0)
    # the ranks held 3 + 1 and 2 + 2 requests while saturated; the drain's are left out
    assert figures.saturated_running == pytest.approx(4.0)


def test_an_emulator_log_measures_like_the_engine_prefill_and_queue_included(tmp_path: Path):
    # two ranks, four iterations; rank 1 computes a prompt in iteration 1 (the last admission)
    (tmp_path / "iterations").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"epoch": 1000.0}))
    pd.DataFrame({
        "iteration": [0, 1, 2, 3], "start_s": [0.0, 1.0, 2.0, 3.0], "end_s": [1.0, 2.0, 3.0, 4.0],
        "emitted": [2, 1, 2, 1], "loads": [[100, 50], [101, 64], [102, 65], [103, 0]],
        "running": [[2, 1], [2, 2], [1, 2], [1, 0]], "waiting": [[0, 1], [0, 0], [0, 0], [0, 0]],
        "prefill": [[0, 0], [0, 64], [0, 0], [0, 0]],
    }).to_parquet(tmp_path / "iterations" / "part-00000.parquet")  # fmt: skip
    steps = read_steps(tmp_path)
    assert steps.loc[steps["rank"] == 1, "waiting"].tolist() == [1, 0, 0, 0]
    figures = measure(steps, 1000.0, 1010.0)
    assert figures.steps == 4 and figures.tokens == 6
    assert figures.prefill_steps == 1 and figures.saturated_steps == 2
    # (200 - 150) and (202 - 165) while saturated; the ranks held 3 then 4 requests
    assert figures.saturated_imbalance_tokens == pytest.approx((50 + 37) / 2)
    assert figures.saturated_running == pytest.approx(3.5)

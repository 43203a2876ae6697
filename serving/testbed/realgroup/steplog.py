"""The engine's own account of a lockstep group: read the plugin's step logs, align the ranks'
forward passes, and measure a run from them.

The vLLM plugin (``plugins/vllm``) writes ``steps-dp{rank}-{pid}.csv``, one row per forward pass
of each rank, real or dummy. In a MoE data-parallel group every rank runs one pass per group
step (a rank with nothing to do runs a dummy one), so pass ``k`` of every rank is step ``k`` of
the group: :func:`read_steps` joins them on that index, and :func:`lockstep` checks the join
(same number of passes, ends close together). :func:`measure` turns the steps of one run into
the figures an A/B compares: step-weighted KV imbalance ``G max_g L_g - sum_g L_g``, time at
the barrier, tokens per second and makespan.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log

COLUMNS = ("rank", "pass", "kind", "start_s", "end_s", "scheduled_tokens", "prefill_tokens",
           "decode_requests", "running", "waiting", "kv_tokens", "new_tokens", "comm_s")  # fmt: skip


def read_rank_logs(folder: Path) -> dict[int, pd.DataFrame]:
    """Every rank's passes from the newest process that logged for it (a restarted server
    starts new files; the old ones stay for the record)."""
    files = sorted(Path(folder).glob("steps-dp*-*.csv"))
    if not files:
        raise UserError(f"{folder}: no step logs (steps-dp*-*.csv); was the server started with "
                        "BALANCEROUTE_STEP_LOG and the balanceroute-vllm plugin?")  # fmt: skip
    newest: dict[int, tuple[float, Path]] = {}
    for path in files:
        rank = int(path.name.split("-")[1].removeprefix("dp"))
        made = path.stat().st_mtime
        if rank not in newest or made > newest[rank][0]:
            newest[rank] = (made, path)
    logs = {}
    for rank, (_, path) in sorted(newest.items()):
        frame = pd.read_csv(path)
        missing = set(COLUMNS) - set(frame.columns)
        if missing:
            raise UserError(f"{path}: not a step log, missing columns {sorted(missing)}")
        logs[rank] = frame
    return logs


def emulator_passes(folder: Path) -> list[pd.DataFrame]:
    """The emulator's iteration log as the plugin's passes, one frame per rank (a rank with
    nothing running takes a dummy pass; the tokens all count on rank 0; prompt tokens computed
    where the log has them), so the same figures measure the emulator and the engine."""
    iterations, _ = read_log(folder)
    epoch = float(json.loads((Path(folder) / "config.json").read_text())["epoch"])
    loads, running = rank_matrix(iterations, "loads"), rank_matrix(iterations, "running")
    prefill, waiting = rank_matrix(iterations, "prefill"), rank_matrix(iterations, "waiting")
    frames = []
    for g in range(loads.shape[1]):
        frames.append(pd.DataFrame({
            "rank": g, "pass": np.arange(len(iterations)),
            "kind": np.where(running[:, g] > 0, "real", "dummy"),
            "start_s": iterations["start_s"].to_numpy(float) + epoch,
            "end_s": iterations["end_s"].to_numpy(float) + epoch,
            "scheduled_tokens": running[:, g], "prefill_tokens": prefill[:, g],
            "decode_requests": running[:, g], "running": running[:, g], "waiting": waiting[:, g],
            "kv_tokens": loads[:, g],
            "new_tokens": iterations["emitted"].to_numpy() if g == 0 else 0,
            "comm_s": np.nan}))  # fmt: skip
    return frames


def read_steps(folder: Path) -> pd.DataFrame:
    """The group's steps: one row per (step, rank), the ranks' passes joined on their index,
    with the group's step end (the last rank's) and its duration (from the previous step's end,
    or from the step's first start when the group sat idle in between). ``folder`` holds the
    plugin's step logs, or is an emulator's ``--log-dir``."""
    if (Path(folder) / "iterations").is_dir():
        frames = emulator_passes(folder)
    else:
        logs = read_rank_logs(folder)
        n = min(len(f) for f in logs.values())
        frames = [f.iloc[:n].assign(step=np.arange(n)) for f in logs.values()]
    frames = [f.assign(step=f["pass"].to_numpy()) if "step" not in f else f for f in frames]
    steps = pd.concat(frames, ignore_index=True).sort_values(["step", "rank"], kind="stable")
    ends = steps.groupby("step")["end_s"].max()
    starts = steps.groupby("step")["start_s"].min()
    # a step lasts from the previous step's end, or from its own start after an idle gap
    duration = ends - np.maximum(ends.shift(1).fillna(-np.inf), starts)
    steps["group_end_s"] = steps["step"].map(ends)
    steps["duration_s"] = steps["step"].map(duration)
    return steps.reset_index(drop=True)


@dataclass(frozen=True, slots=True)
class Lockstep:
    """Whether the ranks stepped together: equal pass counts and ends within a step."""

    passes: tuple[int, ...]
    end_spread_p99_s: float
    step_p50_s: float

    @property
    def holds(self) -> bool:
        return len(set(self.passes)) == 1 and self.end_spread_p99_s <= self.step_p50_s

    def as_dict(self) -> dict:
        return {**asdict(self), "holds": self.holds}


def lockstep(folder: Path) -> Lockstep:
    """Check the join :func:`read_steps` makes: every rank ran as many passes, and pass ``k``
    of every rank ended within one median step of the others'."""
    steps = read_steps(folder)
    emulated = (Path(folder) / "iterations").is_dir()
    logs = {g: f for g, f in steps.groupby("rank")} if emulated else read_rank_logs(folder)
    spread = steps.groupby("step")["end_s"].agg(lambda e: e.max() - e.min())
    durations = steps.drop_duplicates("step")["duration_s"]
    return Lockstep(
        passes=tuple(len(f) for f in logs.values()),
        end_spread_p99_s=float(np.percentile(spread, 99)) if len(spread) else math.nan,
        step_p50_s=float(durations.median()) if len(durations) else math.nan,
    )


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What the engine says about one run: its steps between ``start`` and ``end``, and the
    saturated part of them (up to the last step that prefilled, the last admission: while the
    gateway's pool still held requests, the paper's "iterations with a non-empty pool")."""

    steps: int
    imbalance_tokens: float  # step-weighted mean of G max_g L_g - sum_g L_g
    mean_kv_tokens: float  # step-weighted mean of sum_g L_g / G
    idle_share: float  # share of rank-time spent in dummy passes while another rank worked
    step_s: float  # mean group step
    prefill_steps: int  # steps in which some rank computed prompt tokens
    prefill_share: float  # share of the run's time in steps that prefilled
    tokens: int  # output tokens sampled
    makespan_s: float  # first pass start to last pass end
    throughput_tok_s: float
    saturated_steps: int
    saturated_imbalance_tokens: float
    saturated_step_s: float
    saturated_throughput_tok_s: float
    saturated_running: float  # mean requests the ranks held per saturated step, all ranks

    def as_dict(self) -> dict:
        return asdict(self)


def _per_step(window: pd.DataFrame) -> pd.DataFrame:
    """One row per step: duration, imbalance, mean load, tokens, dummy ranks, prefill tokens,
    requests held."""
    kv = window.pivot(index="step", columns="rank", values="kv_tokens").fillna(0.0)
    by = window.groupby("step")
    return pd.DataFrame({
        "duration_s": by["duration_s"].first(),
        "imbalance": kv.shape[1] * kv.max(axis=1) - kv.sum(axis=1),
        "mean_kv": kv.mean(axis=1),
        "tokens": by["new_tokens"].sum(),
        "dummy": (window["kind"] == "dummy").groupby(window["step"]).sum(),
        "prefill": by["prefill_tokens"].max(),
        "running": by["running"].sum(),
    })  # fmt: skip


def measure(steps: pd.DataFrame, start: float, end: float) -> RunFigures:
    """The figures of the steps that ended within ``[start, end]`` and ran any real pass."""
    window = steps[(steps["group_end_s"] >= start) & (steps["group_end_s"] <= end)]
    real = window.groupby("step")["kind"].transform(lambda k: (k == "real").any())
    window = window[real]
    if window.empty:
        raise UserError(f"no engine steps between {start:.3f} and {end:.3f}: did the run reach "
                        "the group?")  # fmt: skip
    g = window["rank"].nunique()
    table = _per_step(window)
    prefilled = table.index[table["prefill"] > 0]
    full = table.loc[: prefilled[-1]] if len(prefilled) else table.iloc[:0]
    makespan = float(window["end_s"].max() - window["start_s"].min())
    tokens = int(table["tokens"].sum())
    busy = float(table["duration_s"].sum())
    full_s = float(full["duration_s"].sum())
    return RunFigures(
        steps=len(table),
        imbalance_tokens=float(table["imbalance"].mean()),
        mean_kv_tokens=float(table["mean_kv"].mean()),
        idle_share=float((table["duration_s"] * table["dummy"]).sum() / (g * busy)),
        step_s=busy / len(table),
        prefill_steps=len(prefilled),
        prefill_share=float(table.loc[prefilled, "duration_s"].sum() / busy),
        tokens=tokens,
        makespan_s=makespan,
        throughput_tok_s=tokens / makespan if makespan > 0 else math.nan,
        saturated_steps=len(full),
        saturated_imbalance_tokens=float(full["imbalance"].mean()) if len(full) else math.nan,
        saturated_step_s=full_s / len(full) if len(full) else math.nan,
        saturated_throughput_tok_s=float(full["tokens"].sum()) / full_s if full_s else math.nan,
        saturated_running=float(full["running"].mean()) if len(full) else math.nan,
    )

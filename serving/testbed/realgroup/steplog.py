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

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError

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


def read_steps(folder: Path) -> pd.DataFrame:
    """The group's steps: one row per (step, rank), the ranks' passes joined on their index,
    with the group's step end (the last rank's) and its duration since the previous step."""
    logs = read_rank_logs(folder)
    n = min(len(f) for f in logs.values())
    frames = [f.iloc[:n].assign(step=np.arange(n)) for f in logs.values()]
    steps = pd.concat(frames, ignore_index=True).sort_values(["step", "rank"], kind="stable")
    ends = steps.groupby("step")["end_s"].max()
    starts = steps.groupby("step")["start_s"].min()
    duration = ends.diff().fillna(ends - starts)
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
    logs = read_rank_logs(folder)
    steps = read_steps(folder)
    spread = steps.groupby("step")["end_s"].agg(lambda e: e.max() - e.min())
    durations = steps.drop_duplicates("step")["duration_s"]
    return Lockstep(
        passes=tuple(len(f) for f in logs.values()),
        end_spread_p99_s=float(np.percentile(spread, 99)) if len(spread) else math.nan,
        step_p50_s=float(durations.median()) if len(durations) else math.nan,
    )


@dataclass(frozen=True, slots=True)
class RunFigures:
    """What the engine says about one run: its steps between ``start`` and ``end``."""

    steps: int
    imbalance_tokens: float  # step-weighted mean of G max_g L_g - sum_g L_g
    mean_kv_tokens: float  # step-weighted mean of sum_g L_g / G
    barrier_wait_s: float  # per step and rank: collective time beyond the group's fastest
    step_s: float  # mean group step
    prefill_steps: int  # steps in which some rank computed prompt tokens
    tokens: int  # output tokens sampled
    makespan_s: float  # first pass start to last pass end
    throughput_tok_s: float

    def as_dict(self) -> dict:
        return asdict(self)


def measure(steps: pd.DataFrame, start: float, end: float) -> RunFigures:
    """The figures of the steps that ended within ``[start, end]`` and ran any real pass."""
    window = steps[(steps["group_end_s"] >= start) & (steps["group_end_s"] <= end)]
    real = window.groupby("step")["kind"].transform(lambda k: (k == "real").any())
    window = window[real]
    if window.empty:
        raise UserError(f"no engine steps between {start:.3f} and {end:.3f}: did the run reach "
                        "the group?")  # fmt: skip
    kv = window.pivot(index="step", columns="rank", values="kv_tokens").fillna(0.0)
    g = kv.shape[1]
    imbalance = g * kv.max(axis=1) - kv.sum(axis=1)
    comm = window.pivot(index="step", columns="rank", values="comm_s")
    wait = (comm.sub(comm.min(axis=1), axis=0)).mean(axis=1) if comm.notna().all().all() else None
    per_step = window.drop_duplicates("step")
    prefill = window.groupby("step")["prefill_tokens"].max()
    makespan = float(window["end_s"].max() - window["start_s"].min())
    tokens = int(window["new_tokens"].sum())
    return RunFigures(
        steps=int(kv.shape[0]),
        imbalance_tokens=float(imbalance.mean()),
        mean_kv_tokens=float(kv.mean(axis=1).mean()),
        barrier_wait_s=float(wait.mean()) if wait is not None else math.nan,
        step_s=float(per_step["duration_s"].mean()),
        prefill_steps=int((prefill > 0).sum()),
        tokens=tokens,
        makespan_s=makespan,
        throughput_tok_s=tokens / makespan if makespan > 0 else math.nan,
    )

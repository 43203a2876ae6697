"""Per-iteration and per-request records of a run, written next to its summary."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from balanceroute.features.files import write_parquet
from balanceroute.router.lab.metrics import queue_delay_s, tpot_s
from balanceroute.router.lab.simulator import SimResult


def iteration_frame(result: SimResult) -> pd.DataFrame:
    """One row per iteration: time, imbalance, max load, waiting requests, per-worker loads."""
    frame = pd.DataFrame(
        {
            "start_s": result.t_start[:-1],
            "imbalance": result.imbalance,
            "max_load": result.max_load,
            "total_load": result.total_load,
            "waiting": result.waiting,
        }
    )
    if result.loads is not None:
        for g in range(result.loads.shape[1]):
            frame[f"load_{g}"] = result.loads[:, g]
    return frame


def request_frame(result: SimResult) -> pd.DataFrame:
    """One row per request (release order) with its timings and placement."""
    return pd.DataFrame(
        {
            "trace_index": result.trace_index,
            "prompt_tokens": result.prompt_tokens,
            "output_tokens": result.output_tokens,
            "release_s": result.release_s,
            "admit_iteration": result.admit_iter,
            "admit_s": result.admit_s,
            "finish_s": result.finish_s,
            "queue_delay_s": queue_delay_s(result),
            "tpot_s": tpot_s(result),
            "worker": result.worker,
            "overtaken": result.overtaken,
        }
    )


def write_records(result: SimResult, out: Path) -> None:
    """``iterations.parquet`` and ``requests.parquet`` in ``out`` (each written atomically)."""
    for name, frame in (
        ("iterations", iteration_frame(result)),
        ("requests", request_frame(result)),
    ):
        write_parquet(out / f"{name}.parquet", frame)

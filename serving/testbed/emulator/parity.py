"""Replay an emulator run in the simulator: same requests, same ranks, same admission iterations.

The emulator and :mod:`balanceroute.router.lab.simulator` implement one model, so given the
emulator's admissions (from its request log) the simulator must reproduce its per-iteration
loads, durations and token counts. Releases are placed so the simulator sees each request
exactly when the emulator admitted it: at the iteration's model start when the group had been
idle (the simulator jumps its clock to that release, as the emulator restarted its clock),
otherwise half an iteration earlier (strictly inside the previous iteration, so no rounding of
the clock can move it). :class:`~balanceroute.router.lab.scripted.ScriptedPolicy` then admits each
request to its rank at its iteration. Both clocks add the same float durations in the same
order, so the comparison is exact.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.scripted import ScriptedPolicy
from balanceroute.router.lab.simulator import SimConfig, SimResult, simulate
from balanceroute.router.policies.state import RequestTable
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log


def release_times(iterations: pd.DataFrame, admit_iter: np.ndarray) -> np.ndarray:
    """Simulator release time of requests admitted at ``admit_iter`` (see the module doc)."""
    start = iterations["model_start_s"].to_numpy()
    dur = iterations["duration_s"].to_numpy()
    first = np.ones(start.shape[0], dtype=bool)
    first[1:] = start[1:] != start[:-1] + dur[:-1]  # a new busy period began
    rel = start.copy()
    rel[~first] = start[~first] - 0.5 * np.concatenate(([0.0], dur[:-1]))[~first]
    return rel[admit_iter]


def replay(
    iterations: pd.DataFrame, requests: pd.DataFrame, config: EmulatorConfig
) -> tuple[SimResult, pd.DataFrame]:
    """Run the simulator on the emulator's admitted requests; also return them in release order."""
    adm = requests[requests["admit_iteration"] >= 0].copy()
    adm["release_s"] = release_times(iterations, adm["admit_iteration"].to_numpy())
    adm = adm.sort_values(["release_s", "seq"], kind="stable").reset_index(drop=True)
    prompts = adm["prompt_tokens"].to_numpy(dtype=np.int64)
    table = RequestTable(
        prompt_tokens=prompts,
        prompt_key=np.zeros(len(adm), dtype=np.uint64),
        trace_index=np.arange(len(adm), dtype=np.int64),
    )
    released = ReleasedRequests(
        release_s=adm["release_s"].to_numpy(dtype=np.float64),
        prompt_tokens=prompts,
        output_tokens=adm["generated"].to_numpy(dtype=np.int64),
        table=table,
    )
    policy = ScriptedPolicy(adm["admit_iteration"].to_numpy(), adm["worker"].to_numpy())
    sim_cfg = SimConfig(workers=config.ranks, slots=config.slots, cost=config.cost, validate=True)
    return simulate(released, policy, sim_cfg), adm


def compare(directory: str | Path) -> dict[str, Any]:
    """Replay a logged run and report how far the simulator is from the emulator."""
    base = Path(directory)
    config = EmulatorConfig.from_dict(json.loads((base / "config.json").read_text()))
    iterations, requests = read_log(base)
    result, adm = replay(iterations, requests, config)
    loads = rank_matrix(iterations, "loads")
    running = rank_matrix(iterations, "running")
    k = len(iterations)
    # Tokens emitted in iteration k by the simulator: requests with first <= k < first + O
    # (first: admission, or with a prefill term the step computing the last prompt token).
    sim_tokens = np.zeros(max(result.iterations, k) + 1, dtype=np.int64)
    np.add.at(sim_tokens, result.first_iter, 1)
    np.add.at(sim_tokens, result.first_iter + result.output_tokens, -1)
    sim_tokens = np.cumsum(sim_tokens)[: result.iterations]
    sim_dur = config.cost.t_fixed_s + config.cost.t_comm_s + config.cost.t_token_s * result.max_load
    if config.cost.prefills:  # the chunks' cost is not in max_load: the simulator's own steps
        sim_dur = np.diff(result.t_start)
    same_len = result.iterations == k
    return {
        "iterations": k,
        "sim_iterations": result.iterations,
        "requests": len(adm),
        "loads_equal": bool(same_len and np.array_equal(result.loads, loads)),
        "max_load_abs_diff": float(np.abs(result.loads - loads).max()) if same_len and k else None,
        "model_start_equal": bool(
            same_len and np.array_equal(result.t_start[:-1], iterations["model_start_s"].to_numpy())
        ),
        "duration_max_abs_diff_s": (
            float(np.abs(sim_dur - iterations["duration_s"].to_numpy()).max())
            if same_len and k
            else None
        ),
        "tokens_equal": bool(
            same_len and np.array_equal(sim_tokens, iterations["emitted"].to_numpy())
        ),
        "running_equal": bool(same_len and np.array_equal(sim_tokens, running.sum(axis=1))),
        "total_tokens": int(adm["generated"].sum()),
    }

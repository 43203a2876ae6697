"""The A/B on a real lockstep group: every arm serves the same slice through its own gateway.

The engine (a vLLM data-parallel MoE server, already up, logging its steps) stays up for the
whole study; each run starts one gateway with one router in front of it, sends one slice with
``bench``, stops the gateway and waits for the engine to go idle. Runs of a repeat serve the same
slice in a shuffled arm order, so the ratio of an arm to the reference within a repeat is a paired
ratio, and the repeats give its interval (``router.lab.paired``). The engine's figures come from
its step logs (``steplog.measure``); the client's from ``bench``'s summary.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.features.workload import WorkloadSpec
from balanceroute.router.lab.paired import paired_ratio
from balanceroute.serving.testbed.bench.run import BenchConfig, run_bench
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port
from balanceroute.serving.testbed.realgroup.steplog import lockstep, measure

# the group computes its own prompts: BR-H with and without prefill alignment
# (router/policies/prefill_align.py; docs/results.md, "A real lockstep group")
DEFAULT_ARMS = ("count-jsq", "round-robin", "token-jsq", "br0", "brh:none",
                "brh:none{prefill_align=8}")  # fmt: skip
ENGINE_KEYS = ("saturated_imbalance_tokens", "saturated_throughput_tok_s", "imbalance_tokens",
               "throughput_tok_s", "makespan_s", "idle_share", "step_s", "saturated_step_s")  # fmt: skip
SIM_KEYS = ("saturated_imbalance_tokens", "saturated_throughput_tok_s", "imbalance_tokens",
            "throughput_tok_s")  # fmt: skip
IDLE_S = 1.0  # the engine counts as idle after this long without a step
FULL_SHARE = 0.9  # below this share of its slots held while requests wait, a run is underfilled
CLIENT_KEYS = ("output_throughput", "mean_ttft_ms", "median_tpot_ms")


@dataclass(frozen=True, slots=True)
class GroupSpec:
    """The running engine: its URL, G, B, the rank header and where its steps are logged."""

    url: str
    ranks: int
    slots: int
    step_log: Path
    rank_header: str = "X-data-parallel-rank"
    model: str | None = None


@dataclass(frozen=True, slots=True)
class RealAb:
    """One study: arms (the first is the reference) over slices, results under ``out``."""

    group: GroupSpec
    slices: tuple[Path, ...]
    out: Path
    arms: tuple[str, ...] = DEFAULT_ARMS
    seed: int = 0
    gateway_flags: tuple[str, ...] = ()
    idle_s: float = IDLE_S
    run_timeout_s: float = 600.0
    extra: dict[str, Any] = field(default_factory=dict)


def _gateway(study: RealAb, arm: str, folder: Path) -> tuple[ServerProcess, str]:
    """A gateway with one router in front of the group, ready."""
    port = free_port()
    g = study.group
    args = [sys.executable, "-m", "balanceroute.cli", "gateway", "--rank", g.url, "--rank-header",
            g.rank_header, "--ranks", str(g.ranks), "--slots", str(g.slots), "--router", arm,
            "--port", str(port), "--no-mlflow", "--no-twins", "--out", str(folder / "gateway"),
            *study.gateway_flags]  # fmt: skip
    folder.mkdir(parents=True, exist_ok=True)
    proc = ServerProcess(args, log=folder / "gateway.log", env=clean_env())
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready([url + "/readyz"], timeout_s=120)
    return proc, url


def wait_idle(step_log: Path, idle_s: float, timeout_s: float = 300.0) -> None:
    """Until no rank's step log has grown for ``idle_s`` (the group stepped its last; an
    emulator, which writes its log as it goes idle, is given ``idle_s``)."""
    if (step_log / "iterations").is_dir():
        time.sleep(idle_s)
        return
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        newest = max((p.stat().st_mtime for p in step_log.glob("steps-dp*-*.csv")), default=0.0)
        if time.time() - newest >= idle_s:
            return
        time.sleep(min(idle_s, 0.25))
    raise UserError(f"the engine did not go idle within {timeout_s:g} s ({step_log})")


def run_one(study: RealAb, arm: str, slice_path: Path, folder: Path) -> dict[str, Any]:
    """One arm on one slice: its window on the engine's clock and the client's summary."""
    wait_idle(study.group.step_log, study.idle_s)
    proc, url = _gateway(study, arm, folder)
    try:
        start = time.time()
        config = BenchConfig(urls=(url,), out_dir=str(folder / "bench"), prompt_format="ids",
                             workload=WorkloadSpec(trace=str(slice_path)), rate_scale=1.0,
                             model=study.group.model, request_timeout_s=study.run_timeout_s,
                             progress=False)  # fmt: skip
        summary = run_bench(config).summary
        end = time.time()
    finally:
        proc.terminate()
    record = {"arm": arm, "slice": slice_path.name, "start_s": start, "end_s": end,
              "client": {k: summary.get(k) for k in CLIENT_KEYS},
              "completed": summary.get("completed"), "failed": summary.get("failed")}  # fmt: skip
    (folder / "run.json").write_text(json.dumps(record, indent=1))
    return record


def run_study(study: RealAb, progress: Any = print) -> list[dict[str, Any]]:
    """Every arm on every slice, arms shuffled within a slice; the records as they come."""
    rng = np.random.default_rng(study.seed)
    records = []
    for r, slice_path in enumerate(study.slices):
        for i in rng.permutation(len(study.arms)):
            arm = study.arms[int(i)]
            folder = study.out / f"repeat-{r}" / arm.replace(":", "_").replace("/", "_")
            record = {**run_one(study, arm, slice_path, folder), "repeat": r}
            records.append(record)
            progress(f"repeat {r} {arm}: {record['end_s'] - record['start_s']:.1f} s, client "
                     f"{record['client']['output_throughput']:.1f} tok/s, completed "
                     f"{record['completed']}, failed {record['failed']}")  # fmt: skip
    wait_idle(study.group.step_log, study.idle_s)
    return records


def attach_engine(records: list[dict[str, Any]], steps: Any, idle_s: float) -> None:
    """Each run's engine figures, from the steps that ended within its window."""
    for record in records:
        figures = measure(steps, record["start_s"], record["end_s"] + idle_s)
        record["engine"] = figures.as_dict()


def _by_repeat(records: list[dict], arm: str, part: str, key: str) -> np.ndarray:
    rows = sorted((r for r in records if r["arm"] == arm), key=lambda r: r["repeat"])
    return np.array([float(r[part][key] or np.nan) for r in rows])


def summarize(records: list[dict], arms: tuple[str, ...], client: bool = True) -> dict[str, Any]:
    """Each arm's paired ratios to the first arm, per engine and client figure, with intervals
    (only the figures the records hold)."""
    reference = arms[0]
    parts = (
        (("engine", ENGINE_KEYS), ("client", CLIENT_KEYS)) if client else (("engine", SIM_KEYS),)
    )
    table: dict[str, Any] = {}
    for arm in arms[1:]:
        row: dict[str, Any] = {}
        for part, keys in parts:
            for key in keys:
                ratio = paired_ratio(_by_repeat(records, arm, part, key),
                                     _by_repeat(records, reference, part, key),
                                     higher_is_better="throughput" in key)  # fmt: skip
                row[f"{part}.{key}"] = None if ratio is None else ratio.as_dict()
        table[arm] = row
    return table


def fidelity(records: list[dict], simulated: list[dict], arms: tuple[str, ...]) -> dict[str, Any]:
    """Per arm, the simulator's mean over the engine's mean of each saturated figure, in tokens
    and tokens a second, on the same slices: where the ratios to the reference disagree, whether
    the arm or the reference is off."""
    keys = ("saturated_imbalance_tokens", "saturated_throughput_tok_s")
    out: dict[str, Any] = {}
    for arm in arms:
        row = {}
        for key in keys:
            engine = np.nanmean(_by_repeat(records, arm, "engine", key))
            sim = np.nanmean(_by_repeat(simulated, arm, "engine", key))
            row[key] = float(sim / engine) if engine > 0 else None
        out[arm] = row
    return out


def occupancy(records: list[dict], slots_total: int) -> dict[str, float]:
    """The share of the group's ``G B`` slots its ranks held while requests waited at the
    gateway: the lowest run's and the mean. Well below 1, the gateway heard finishes late (a
    front end starved of CPU, a slow network) and the run measured the lag, not the router. Arms
    that leave slots free by design (``prefill_align``, ``kv_capacity``) are not counted."""
    shares = [float(r["engine"]["saturated_running"]) / slots_total for r in records
              if np.isfinite(r["engine"].get("saturated_running", np.nan))
              and _fills_slots(r["arm"])]  # fmt: skip
    if not shares:
        return {"min": math.nan, "mean": math.nan}
    return {"min": min(shares), "mean": float(np.mean(shares))}


def _fills_slots(arm: str) -> bool:
    """Whether ``arm`` (``router[:estimator]{name=value;...}``) admits into every free slot
    while requests wait: it sets neither ``prefill_align`` nor ``kv_capacity``."""
    items = arm.partition("{")[2].removesuffix("}").split(";")
    options = dict(i.replace(" ", "").split("=", 1) for i in items if "=" in i)
    return options.get("prefill_align", "0") == "0" and options.get("kv_capacity", "none") in (
        "none", "None", "null")


def group_lockstep(step_log: Path) -> dict[str, Any]:
    """The lockstep check over everything the group logged."""
    return lockstep(step_log).as_dict()


def engine_info(url: str, ranks: int, slots: int) -> dict[str, Any]:
    """What the engine says it is: version and model, beside G and B."""
    info: dict[str, Any] = {"url": url, "ranks": ranks, "slots": slots}
    with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, IndexError):
        info["version"] = httpx.get(url + "/version", timeout=5).json().get("version")
        info["model"] = httpx.get(url + "/v1/models", timeout=5).json()["data"][0]["id"]
    return info


def engine_ready(url: str, timeout_s: float = 900.0) -> None:
    """Until the engine answers ``/v1/models``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/v1/models", timeout=2.0).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1.0)
    raise UserError(f"the engine at {url} did not answer /v1/models within {timeout_s:g} s")

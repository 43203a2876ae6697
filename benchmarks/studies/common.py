"""Shared plumbing for the benchmark and study scripts: workloads, repeats, parallel runs.

Real traces are read from ``../shared/data`` at run time. A *repeat* of a real trace is a
window of it (half the trace, five evenly spaced starts); a repeat of a synthetic preset is a
fresh seed. Results are cached as JSON lines so an interrupted study resumes.
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from joblib import Parallel, delayed

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.files import jsonable
from balanceroute.features.loaders import load_trace
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, replay
from balanceroute.router.policies.specs import RouterSpec

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"

WORKLOADS: dict[str, dict[str, Any]] = {
    "azure": {"trace": DATA / "azure_llm_2023_conv.csv"},
    "mooncake": {"trace": DATA / "mooncake_conversation.jsonl", "key_blocks": 2},
    "paper-prod": {"preset": "paper-prod", "requests": 8000},
}
WINDOW = 0.5


@dataclass(frozen=True)
class Point:
    """One replay of a study grid."""

    workload: str
    repeat: int
    router: str
    estimator: str | None = None
    options: tuple[tuple[str, Any], ...] = ()
    workers: int = 8
    slots: int = 32
    load: float | None = None  # None = saturated
    repeats: int = 5
    window: float = WINDOW
    tag: str = ""
    extra: dict = field(default_factory=dict, compare=False, hash=False)

    def key(self) -> str:
        d = asdict(self)
        d.pop("extra")
        return hashlib.sha1(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


_FRAMES: dict[tuple[str, int, int, float], pd.DataFrame] = {}


def workload_frame(
    name: str, repeat: int, repeats: int = 5, window: float = WINDOW
) -> pd.DataFrame:
    """The requests of one repeat: a window of a real trace, or a seeded synthetic trace."""
    key = (name, repeat, repeats, window)
    if key in _FRAMES:
        return _FRAMES[key]
    spec = WORKLOADS[name]
    if "trace" in spec:
        full = load_trace(spec["trace"], key_blocks=spec.get("key_blocks", 2))
        n = len(full)
        size = int(n * window)
        start = round((n - size) * repeat / max(1, repeats - 1))
        frame = full.iloc[start : start + size].reset_index(drop=True)
        frame["arrival_s"] = frame["arrival_s"] - frame["arrival_s"].iloc[0]
    else:
        frame = generate(spec["preset"], int(spec["requests"] * window / WINDOW), seed=repeat)
    _FRAMES[key] = frame
    return frame


def run_point(point: Point) -> dict[str, Any]:
    """Replay one point and return its summary (without per-iteration records)."""
    frame = workload_frame(point.workload, point.repeat, point.repeats, point.window)
    est_spec = None
    if point.estimator is not None:
        params = {"sigma": point.extra["sigma"]} if "sigma" in point.extra else {}
        est_spec = EstimatorSpec(point.estimator, params=params)
    router = RouterSpec(point.router, est_spec, dict(point.options))
    est = None
    if est_spec is not None:
        horizon = max(1, router.horizon if router.horizon is not None else DEFAULT_HORIZON)
        est = build_estimator(est_spec, history=frame, replay=frame, horizon=horizon)
    spec = ReplaySpec(
        router=router,
        workers=point.workers,
        slots=point.slots,
        seed=point.repeat,
        prefill=PrefillConfig(saturate=point.load is None),
        load=point.load,
    )
    _, summary = replay(frame, spec, estimator=est, record_loads=False)
    summary.pop("config", None)
    return {**asdict(point), "summary": summary}


def run_points(points: list[Point], cache: Path | None, jobs: int = 2) -> list[dict[str, Any]]:
    """Run every point (cached ones are read back), in parallel processes."""
    done: dict[str, dict] = {}
    if cache is not None and cache.exists():
        for line in cache.read_text().splitlines():
            rec = json.loads(line)
            done[rec["key"]] = rec
    todo = [p for p in points if p.key() not in done]
    if todo:
        print(f"running {len(todo)} of {len(points)} points with {jobs} jobs", file=sys.stderr)
        out = Parallel(n_jobs=jobs, return_as="generator_unordered", verbose=0)(
            delayed(_keyed)(p) for p in todo
        )
        for i, rec in enumerate(out, 1):
            done[rec["key"]] = rec
            if cache is not None:
                cache.parent.mkdir(parents=True, exist_ok=True)
                with cache.open("a") as fh:
                    fh.write(json.dumps(rec, default=jsonable) + "\n")
            if i % 10 == 0 or i == len(todo):
                print(f"  {i}/{len(todo)} done", file=sys.stderr)
    return [done[p.key()] for p in points]


def _keyed(point: Point) -> dict[str, Any]:
    rec = run_point(point)
    rec["key"] = point.key()
    return rec


def median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs, dtype=float)))


def jobs_from_env() -> int:
    return int(os.environ.get("BALANCEROUTE_JOBS", "2"))

"""Tick gaps while the live twin stepped and otherwise, from ``live_twin.py``'s output, as JSON.

A step's CPU shows in ``/metrics`` only when it ends, so a poll whose twin CPU rose by ``c``
seconds marks a step ending there; the window taken is ``3 c`` seconds before that poll up to it
(a step's wall time under load is longer than its CPU). Tick times are those of the gateway's
``ticks.parquet``, placed on the polls' clock by the first tick (within a poll's second or so).

    .venv/bin/python benchmarks/perf/twin_step_ticks.py runs/twinloop_load_nice0
"""

from __future__ import annotations

import argparse
import itertools
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd


def stats(gaps: np.ndarray) -> dict[str, Any]:
    """Count, p50, p99 and max of tick gaps, in ms."""
    if not gaps.size:
        return {"ticks": 0}
    p50, p99 = np.percentile(gaps, [50, 99]) * 1e3
    return {"ticks": int(gaps.size), "p50_ms": round(float(p50), 1),
            "p99_ms": round(float(p99), 1), "max_ms": round(float(gaps.max() * 1e3), 1)}  # fmt: skip


def split(run: Path) -> dict[str, Any]:
    """The run's tick gaps inside and outside the twin's step windows."""
    result = json.loads(Path(f"{run}.json").read_text())
    ticks = pd.read_parquet(run / "gateway" / "ticks.parquet", columns=["time_s"])["time_s"]
    t = np.sort(ticks.to_numpy())
    polls = [(p["t_s"], next(iter(p["twins"].values()))["twin_cpu_seconds"])
             for p in result["polls"] if p.get("twins")]  # fmt: skip
    pairs = itertools.pairwise(polls)
    windows = [(b - 3 * (cb - ca), b) for (_, ca), (b, cb) in pairs if cb - ca > 0.3]
    gaps, at = np.diff(t), t[1:] - t[0]
    inside = np.zeros(gaps.size, dtype=bool)
    for a, b in windows:
        inside |= (at >= a - 1) & (at <= b + 1)
    return {"run": str(run), "step_windows_s": [[round(a, 1), round(b, 1)] for a, b in windows],
            "stepping": stats(gaps[inside]), "otherwise": stats(gaps[~inside])}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="+", type=Path, help="live_twin.py --out folders, RUN.json beside")
    print(json.dumps([split(r) for r in p.parse_args().runs], indent=2))


if __name__ == "__main__":
    main()

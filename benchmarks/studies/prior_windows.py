"""How many windows the twin's prior needs: one measurement of 16 windows, judged on its subsets.

The prior (router/lab/twin/prior_measure.py) replays evenly spaced windows of the twin's block
length (``8 G B`` requests) over requests the model never saw, under every candidate weight.
Windows of 16 starting points include the starting points of 6 and of 4 evenly spaced windows
exactly (every 3rd and every 5th), so one measurement of 16 gives the prior that 6 or 4 windows
would have given, and the replay time each costs. For each case (a trace, its first
``--train`` share fitting the estimator, the rest the holdout replayed) prints JSON: per window
count, the start weight, the harmful verdict (training/twin_judge.py), the mean log ratio, its
standard error and the upper end of every candidate, and the replay seconds.

    .venv/bin/python benchmarks/studies/prior_windows.py --case paper-prod \
        [--case azure --case mooncake] [--kind gbdt] [--group 8x32] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

from balanceroute.features.synthetic import generate
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.router.lab.twin import prior_measure
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.lab.twin.prior import PriorConfig
from balanceroute.training.holdout import make_holdout
from balanceroute.training.twin_judge import twin_verdict

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import DATA

FULL = 16
SUBSETS = (16, 6, 4)  # (FULL - 1) % (w - 1) == 0: exact subsets of the 16 starting points
TRACES = {"azure": "azure_llm_2023_conv.csv", "mooncake": "mooncake_conversation.jsonl"}


def case_frame(case: str, data: Path):
    """The case's requests: a shared trace by name, else 20,000 of a synthetic preset."""
    if case in TRACES:
        frame, _ = load_workload(WorkloadSpec(trace=str(data / TRACES[case])))
        return frame
    return generate(case, 20_000, seed=0)


def timed_windows(est, holdout, cfg: PriorConfig, twin: TwinConfig):
    """The 16-window metric matrix and the replay seconds of each window (all candidates)."""
    seconds: list[float] = []
    replay = prior_measure.replay_candidate

    def clocked(*args, **kwargs):
        t0 = time.perf_counter()
        out = replay(*args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        return out

    prior_measure.replay_candidate = clocked
    try:
        fw = prior_measure.fold_windows(est, holdout, cfg, twin, {}, FULL)
    finally:
        prior_measure.replay_candidate = replay
    k = len(twin.candidates)
    return fw, np.array(seconds).reshape(-1, k)


def judged_subset(metric, seconds, n, size, cfg, twin, w):
    """The prior ``w`` evenly spaced windows give: rows of the 16 that are its starting points."""
    starts16 = np.unique(np.round(np.linspace(0, n - size, FULL)).astype(int))
    starts_w = np.unique(np.round(np.linspace(0, n - size, w)).astype(int))
    rows = np.flatnonzero(np.isin(starts16, starts_w))
    overlap = len(rows) * size / n
    common = {
        "candidates": tuple(twin.candidates), "block_requests": size, "workers": cfg.workers,
        "slots": cfg.slots, "load": cfg.load, "holdout_requests": n,
        "holdout_first_arrival_s": 0.0, "holdout_last_arrival_s": 0.0, "folds": 1,
    }  # fmt: skip
    prior = prior_measure.judged(metric[rows], twin, overlap, len(rows), common)
    verdict = twin_verdict([prior.as_dict()], cfg.workers, cfg.slots)
    return {
        "windows": len(rows),
        "overlap": round(overlap, 3),
        "start_weight": prior.start_weight,
        "harmful": verdict.harmful,
        "mean_log_ratio": list(prior.mean_log_ratio),
        "se": list(prior.se),
        "upper": list(prior.upper),
        "replay_s": round(float(seconds[rows].sum()), 1),
    }


def run_case(case: str, kind: str, group: tuple[int, int], train: float, data: Path) -> dict:
    """Fit ``kind`` on the case's earlier part, measure 16 windows, judge every subset."""
    frame = case_frame(case, data)
    holdout = make_holdout(frame, train, 0)
    est = build_estimator(EstimatorSpec(kind), history=holdout.train)
    cfg = PriorConfig(workers=group[0], slots=group[1], windows=FULL)
    # all 16 windows, however closely they overlap (fold_windows caps them at the twin's own
    # spacing, prior_measure.spaced_windows, which reads the twin's overlap)
    twin = replace(TwinConfig(), overlap=FULL)
    size = twin.block_size(*group)
    t0 = time.perf_counter()
    fw, seconds = timed_windows(est, holdout.test, cfg, twin)
    wall = time.perf_counter() - t0
    n = fw.requests
    out = {"case": case, "kind": kind, "group": f"{group[0]}x{group[1]}", "holdout": n,
           "block": size, "wall_s": round(wall, 1), "subsets": []}  # fmt: skip
    if fw.metric.shape[0] < 2:
        out["note"] = "fewer than two windows"
        return out
    out["seconds_per_window"] = [round(float(s), 2) for s in seconds.sum(axis=1)]
    for w in SUBSETS:
        out["subsets"].append(judged_subset(fw.metric, seconds, n, size, cfg, twin, w))
    base = out["subsets"][0]
    for sub in out["subsets"][1:]:
        sub["shift_in_se16"] = [
            round((m - m16) / s16, 3) if s16 > 0 else 0.0
            for m, m16, s16 in zip(sub["mean_log_ratio"], base["mean_log_ratio"], base["se"],
                                   strict=True)
        ]  # fmt: skip
        sub["same_start"] = sub["start_weight"] == base["start_weight"]
        sub["same_verdict"] = sub["harmful"] == base["harmful"]
    return out


def main() -> None:
    """Run every case and print the JSON."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", action="append", help="azure, mooncake or a synthetic preset")
    p.add_argument("--kind", default="gbdt")
    p.add_argument("--group", default="8x32")
    p.add_argument("--train", type=float, default=0.7, help="share fitting the estimator (0.7)")
    p.add_argument("--data", type=Path, default=DATA)
    p.add_argument("--out", type=Path)
    a = p.parse_args()
    g, b = (int(x) for x in a.group.lower().split("x"))
    results = []
    for case in a.case or ["paper-prod"]:
        results.append(run_case(case, a.kind, (g, b), a.train, a.data))
        print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    text = json.dumps(results, indent=2, default=lambda v: None if math.isnan(v) else v)
    if a.out:
        a.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

"""Paired ratio of one arm to another across two `ab` runs over the same windows.

`ab` pairs every arm with its reference within a run; replays are deterministic, so arms of
separate runs on the same trace, windows and group pair window by window too. Prints the ratio
of steady imbalance with `ab`'s own interval (the runs' window overlap) and verdict:

    python benchmarks/studies/pair_runs.py RUN_A:ARM_A RUN_B:ARM_B
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.router.lab.paired import paired_ratio


def arm_windows(spec: str) -> tuple[np.ndarray, float, list]:
    """Per-window steady imbalance of ``RUN:ARM``, the run's overlap and its windows."""
    run, sep, arm = spec.partition(":")
    if not sep:
        raise UserError(f"'{spec}': expected RUN_DIR:ARM")
    summary = json.loads((Path(run) / "summary.json").read_text())
    if arm not in summary["arms"]:
        raise UserError(f"'{spec}': no arm '{arm}'; arms: {', '.join(summary['arms'])}")
    values = np.array([r["steady_mean_imbalance"] for r in summary["arms"][arm]["repeats"]])
    cfg = summary["config"]
    return values, float(cfg["window_overlap"]), cfg["windows"]


def main() -> None:
    """Print the paired ratio of the first arm to the second."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("arm", help="RUN_DIR:ARM, the numerator")
    ap.add_argument("reference", help="RUN_DIR:ARM, the denominator")
    args = ap.parse_args()
    a, overlap, windows_a = arm_windows(args.arm)
    b, _, windows_b = arm_windows(args.reference)
    if windows_a != windows_b:
        raise UserError("the two runs replayed different windows: nothing pairs")
    r = paired_ratio(a, b, overlap=overlap)
    if r is None:
        raise UserError("fewer than two windows with positive imbalance in both runs")
    print(json.dumps({"arm": args.arm, "reference": args.reference, **r.as_dict()}))


if __name__ == "__main__":
    main()

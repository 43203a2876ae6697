"""The queueing tail per window (issue 19, item 5): from `balanceroute ab` summaries, each arm's
p99 queueing delay over `count-jsq`'s in the same window (median, worst, windows above the
bound), its steady imbalance paired to the reference arm (the interval `ab` reports, noise
floor beside it) and the share of BR-H's imbalance advantage over `count-jsq` it keeps.

    .venv/bin/python benchmarks/studies/tail_study.py runs/tail/azure-b32 [more ab --out dirs]

Prints a Markdown table per summary and one JSON line per (summary, arm) with every window's
p99 ratio, for docs/results.md ("The queueing tail").
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

BASELINE = "count-jsq"
BOUND = 1.25


def load_summary(folder: Path) -> dict[str, Any]:
    """An `ab` summary; a clear error if the folder holds none or lacks the baseline arm."""
    path = folder / "summary.json"
    if not path.is_file():
        sys.exit(f"tail_study: no summary.json in {folder} (run `balanceroute ab --out` there)")
    summary = json.loads(path.read_text())
    if BASELINE not in summary["arms"]:
        sys.exit(f"tail_study: {path} has no '{BASELINE}' arm to compare the tail with")
    return summary


def per_window(summary: dict[str, Any], arm: str, key: str) -> np.ndarray:
    """One value of ``key`` per window, in window order."""
    return np.array([r[key] for r in summary["arms"][arm]["repeats"]], dtype=np.float64)


def arm_row(summary: dict[str, Any], arm: str) -> dict[str, Any]:
    """The tail and imbalance figures of one arm against the baseline and the reference."""
    p99 = per_window(summary, arm, "queue_delay_p99_s") / per_window(
        summary, BASELINE, "queue_delay_p99_s"
    )
    i_cjsq = per_window(summary, BASELINE, "steady_mean_imbalance")
    i_ref = per_window(summary, summary["reference"], "steady_mean_imbalance")
    i_arm = per_window(summary, arm, "steady_mean_imbalance")
    steady = (i_cjsq > 0) & (i_ref > 0)  # windows whose pool ever held a request after admission
    kept = (1 - i_arm[steady] / i_cjsq[steady]) / (1 - i_ref[steady] / i_cjsq[steady])
    paired = summary["arms"][arm].get("paired", {}).get("steady_mean_imbalance")
    return {
        "arm": arm,
        "p99_ratio_median": float(np.median(p99)),
        "p99_ratio_worst": float(p99.max()),
        "windows_above": int((p99 > BOUND).sum()),
        "windows": int(p99.size),
        "steady_imbalance_paired": paired,
        "steady_windows": int(steady.sum()),
        "advantage_kept_median": float(np.median(kept)) if kept.size else None,
        "advantage_kept_min": float(kept.min()) if kept.size else None,
        "p99_ratio_per_window": [round(float(x), 4) for x in p99],
    }


def fmt_paired(p: dict[str, Any] | None) -> str:
    if not p:
        return ""
    return f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]"


def fmt_kept(r: dict[str, Any]) -> str:
    if r["advantage_kept_median"] is None:
        return "no steady window"
    return (
        f"{r['advantage_kept_median']:.3f} ({r['advantage_kept_min']:.3f}; "
        f"{r['steady_windows']} steady windows)"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path, help="`balanceroute ab --out` folders")
    args = parser.parse_args()
    for folder in args.folders:
        summary = load_summary(folder)
        cfg = summary["config"]
        print(
            f"\n{folder} (B = {cfg['slots']}, {cfg.get('window_requests')} requests x "
            f"{cfg['repeats']} windows, overlap {cfg.get('window_overlap', 1.0):.2f})\n"
        )
        print(
            "| arm | p99 / count-jsq median | worst | windows > 1.25 | steady I / ref [95%] "
            "| advantage kept median (min) |"
        )
        print("|---|---|---|---|---|---|")
        rows = [arm_row(summary, a) for a in summary["arms"] if a != BASELINE]
        for r in rows:
            print(
                f"| `{r['arm']}` | {r['p99_ratio_median']:.3f} | {r['p99_ratio_worst']:.3f} | "
                f"{r['windows_above']}/{r['windows']} | {fmt_paired(r['steady_imbalance_paired'])} "
                f"| {fmt_kept(r)} |"
            )
        noise = summary.get("noise_floor", {}).get("paired", {}).get("steady_mean_imbalance")
        if noise:
            print(f"| noise floor | | | | {fmt_paired(noise)} | |")
        for r in rows:
            print(json.dumps({"summary": str(folder), **r}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Condense A/B replays (``DIR/*/summary.json``) into the README's tables and the target checks.

Every cell is the median over repeats of the ratio to ``--reference`` taken repeat by repeat
(the replays are paired), at the main ``G`` of each run. Prints Markdown, then (``--json``) the
target checks of the issues as JSON.

    .venv/bin/python benchmarks/ab_tables.py runs/ab [--reference count-jsq] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

METRICS = (
    ("steady_mean_imbalance", "I steady"),
    ("mean_imbalance", "I all"),
    ("throughput_tok_s", "tput"),
    ("tpot_p95_ms", "TPOT p95"),
    ("queue_delay_p99_s", "wait p99"),
    ("max_queue_delay_s", "wait max"),
)
LEARNED = ("survival", "exactmatch", "gbdt")


def repeats_at(summary: dict, arm: str) -> list[dict[str, Any]]:
    """Per-repeat figures of ``arm`` at the run's main G."""
    st = summary["arms"][arm]
    g = str(summary["config"].get("main_workers", ""))
    if "by_workers" in st and g in st["by_workers"]:
        st = st["by_workers"][g]
    return st["repeats"]


def paired(summary: dict, arm: str, ref: str, metric: str) -> list[float]:
    """Ratios ``arm / ref`` of ``metric``, repeat by repeat."""
    a, b = repeats_at(summary, arm), repeats_at(summary, ref)
    return [x[metric] / y[metric] for x, y in zip(a, b, strict=True) if x[metric] and y[metric]]


def median_ratio(summary: dict, arm: str, ref: str, metric: str) -> float | None:
    r = paired(summary, arm, ref, metric)
    return statistics.median(r) if r else None


def label(summary: dict, name: str) -> str:
    cfg = summary["config"]
    mode = "saturated" if cfg["saturate"] else f"{cfg['load']}x capacity"
    return f"{name}: G = {cfg.get('main_workers', 8)}, B = {cfg['slots']}, {mode}"


def table(summary: dict, name: str, ref: str) -> str:
    lines = [
        f"**{label(summary, name)}**, {len(summary['config']['windows'])} repeats "
        f"(median ratio to `{ref}`)",
        "",
        "| arm | " + " | ".join(t for _, t in METRICS) + " |",
        "|---" * (len(METRICS) + 1) + "|",
    ]
    for arm in summary["config"]["arms"]:
        cells = []
        for m, _ in METRICS:
            v = median_ratio(summary, arm, ref, m)
            cells.append("n/a" if v is None else f"{v:.3f}")
        lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def learned_arms(summary: dict) -> list[str]:
    return [a for a in summary["config"]["arms"] if a.split("{")[0].split(":")[-1] in LEARNED]


def checks(summaries: dict[str, dict], ref: str) -> dict[str, Any]:
    """The issues' targets that a set of A/B runs can answer, per run."""
    out: dict[str, Any] = {}
    for name, s in summaries.items():
        arms = s["config"]["arms"]
        steady = {a: median_ratio(s, a, ref, "steady_mean_imbalance") for a in arms}
        deploy = {a: steady[a] for a in learned_arms(s)}
        best = min(deploy, key=deploy.get) if deploy else None
        row: dict[str, Any] = {"steady_vs_" + ref: {a: round(v, 4) for a, v in steady.items()}}
        if best:
            row["best_deployable"] = best
            if "token-jsq" in arms:
                row["best_deployable_vs_token_jsq"] = round(
                    median_ratio(s, best, "token-jsq", "steady_mean_imbalance"), 4
                )
            row["best_deployable_throughput_vs_" + ref] = round(
                median_ratio(s, best, ref, "throughput_tok_s"), 4
            )
            row["best_deployable_wait_p99_vs_" + ref] = round(
                median_ratio(s, best, ref, "queue_delay_p99_s"), 4
            )
        if "brh:oracle" in arms:
            row["oracle_wait_p99_vs_" + ref] = round(
                median_ratio(s, "brh:oracle", ref, "queue_delay_p99_s"), 4
            )
            row["oracle_wait_max_vs_" + ref] = round(
                median_ratio(s, "brh:oracle", ref, "max_queue_delay_s"), 4
            )
            if "br0" in arms:
                below = paired(s, "brh:oracle", "br0", "steady_mean_imbalance")
                row["oracle_below_br0_every_repeat"] = all(r < 1 for r in below)
            if "brh:none" in arms:
                row["oracle_vs_none"] = round(
                    median_ratio(s, "brh:oracle", "brh:none", "steady_mean_imbalance"), 4
                )
                gaps = {}
                for a in learned_arms(s):
                    none = repeats_at(s, "brh:none")
                    est, orc = repeats_at(s, a), repeats_at(s, "brh:oracle")
                    key = "steady_mean_imbalance"
                    closed = [
                        (n[key] - e[key]) / (n[key] - o[key])
                        for n, e, o in zip(none, est, orc, strict=True)
                        if n[key] - o[key] > 0
                    ]
                    gaps[a] = round(statistics.median(closed), 3) if closed else None
                row["gap_closed_median"] = gaps
        out[name] = row
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="runs/ab")
    ap.add_argument("--reference", default="count-jsq")
    ap.add_argument("--json", action="store_true", help="also print the target checks")
    args = ap.parse_args()
    summaries = {
        p.parent.name: json.loads(p.read_text())
        for p in sorted(Path(args.root).glob("*/summary.json"))
    }
    for name, s in summaries.items():
        print(table(s, name, args.reference) + "\n")
    if args.json:
        print(json.dumps(checks(summaries, args.reference), indent=2))


if __name__ == "__main__":
    main()

"""Condense A/B replays (``DIR/*/summary.json``) into the README's tables and the target checks.

Every cell is the median over repeats of the ratio to ``--reference`` taken repeat by repeat
(the replays are paired), at the main ``G`` of each run. Prints Markdown, then (``--json``) the
target checks of the issues as JSON; ``--write docs/results.md`` regenerates the routing sections
of the results document (between its ``<!-- ab-tables:NAME -->`` markers) instead.

    .venv/bin/python benchmarks/studies/ab_tables.py runs/ab [--reference count-jsq] [--json]
    .venv/bin/python benchmarks/studies/ab_tables.py runs/ab --write docs/results.md
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
from pathlib import Path
from typing import Any

from balanceroute.features.files import write_text
from balanceroute.router.lab.paired import HIGHER_IS_BETTER, paired_ratio

METRICS = (
    ("steady_mean_imbalance", "I steady"),
    ("mean_imbalance", "I all"),
    ("throughput_tok_s", "tput"),
    ("tpot_p95_ms", "TPOT p95"),
    ("queue_delay_p99_s", "wait p99"),
    ("max_queue_delay_s", "wait max"),
)
LEARNED = ("survival", "exactmatch", "gbdt", "hazard")


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


def interval(summary: dict, arm: str, ref: str, metric: str) -> dict[str, Any] | None:
    """Paired ratio of ``arm`` to ``ref`` over the run's windows: geometric mean, 95%
    t-interval on log ratios (widened by the windows' overlap) and verdict. ``arm`` may be
    ``noise floor`` (the reference on windows shifted by one request, when the run has it)."""
    if arm == "noise floor":
        if "noise_floor" not in summary or ref != summary["reference"]:
            return None
        a = summary["noise_floor"]["repeats"]
    elif arm in summary["arms"]:
        a = repeats_at(summary, arm)
    else:
        return None
    b = repeats_at(summary, ref)
    pr = paired_ratio(
        [x[metric] if x[metric] is not None else float("nan") for x in a],
        [y[metric] if y[metric] is not None else float("nan") for y in b],
        overlap=summary["config"].get("window_overlap", 1.0),
        higher_is_better=metric in HIGHER_IS_BETTER,
    )
    return None if pr is None else pr.as_dict()


def interval_cell(p: dict[str, Any] | None) -> str:
    """``ratio [low, high]`` and a verdict mark (+ better, - worse, ~ no difference detected)."""
    if p is None:
        return "n/a"
    mark = {"better": "+", "worse": "-"}.get(p["verdict"], "~")
    return f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}] {mark}"


def interval_table(summaries: dict[str, dict], ref: str, metric: str) -> str:
    """Runs as rows, arms as columns: paired ratio to ``ref`` [95% interval] and verdict, with
    the noise floor (the same router on windows shifted by one request) in the last column."""
    arms: list[str] = []
    for s in summaries.values():
        arms += [a for a in s["config"]["arms"] if a != ref and a not in arms]
    cols = [*arms, "noise floor"]
    rows = [
        "| run (windows) | " + " | ".join(f"`{a}`" if a in arms else a for a in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for name, s in summaries.items():
        if ref not in s["arms"]:
            continue
        n = len(s["config"]["windows"])
        cells = [interval_cell(interval(s, a, ref, metric)) for a in cols]
        rows.append(f"| {label(s, name)} ({n}) | " + " | ".join(cells) + " |")
    return "\n".join(rows)


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


def headline(summaries: dict[str, dict], workload: str, ref: str) -> str:
    """One table per workload: steady imbalance ratio in every run, plus throughput and
    queueing ratios, arms as rows (the README's results)."""
    runs = {n: s for n, s in summaries.items() if n.startswith(workload + "-")}
    if not runs:
        return ""

    def short(n: str) -> str:
        s = runs[n]["config"]
        return f"B={s['slots']} " + ("sat" if s["saturate"] else f"{s['load']}x")

    names = sorted(runs, key=lambda n: (runs[n]["config"]["slots"], runs[n]["config"]["load"] or 0))
    sat = [n for n in names if runs[n]["config"]["saturate"]]
    load = [n for n in names if not runs[n]["config"]["saturate"]]
    cols = [("steady_mean_imbalance", n, f"I {short(n)}") for n in names]
    cols += [("mean_imbalance", n, f"I all {short(n)}") for n in sat[:1]]
    cols += [("throughput_tok_s", n, f"tput {short(n)}") for n in sat]
    cols += [("queue_delay_p99_s", n, f"wait p99 {short(n)}") for n in load]
    cols += [("max_queue_delay_s", n, f"wait max {short(n)}") for n in load[:1]]
    arms = runs[names[0]]["config"]["arms"]
    lines = [
        "| arm | " + " | ".join(c[2] for c in cols) + " |",
        "|---" * (len(cols) + 1) + "|",
    ]
    for arm in arms:
        cells = []
        for metric, n, _ in cols:
            v = median_ratio(runs[n], arm, ref, metric) if arm in runs[n]["arms"] else None
            cells.append("n/a" if v is None else f"{v:.3f}")
        lines.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return "\n".join(lines)


HELPS = 0.97  # the oracle "helps" where it cuts brh:none's steady imbalance by 3% or more


def gap_closed(summary: dict, arm: str, metric: str = "steady_mean_imbalance") -> float | None:
    """Share of the oracle's gain over ``brh:none`` that ``arm`` recovers, from the median
    paired ratios: ``(1 - arm/none) / (1 - oracle/none)``; None where the oracle does not help."""
    oracle = median_ratio(summary, "brh:oracle", "brh:none", metric)
    mine = median_ratio(summary, arm, "brh:none", metric)
    if oracle is None or mine is None or oracle > HELPS:
        return None
    return (1.0 - mine) / (1.0 - oracle)


def fmt(value: float | None) -> str:
    """A ratio to three decimals, or n/a (no steady state to compare)."""
    return "n/a" if value is None else f"{value:.3f}"


def value_table(summaries: dict[str, dict], suffix: str = "") -> str:
    """The same router without prediction, with each estimator and with the oracle: steady
    imbalance ratio to ``brh:none`` and the share of the oracle's gain each recovers (the
    estimator arms are ``brh:<kind><suffix>``, e.g. ``{guard=false}``; runs without an oracle
    arm show n/a for it)."""
    rows = [
        "| run | oracle / none | " + " | ".join(f"{e} / none (gap closed)" for e in LEARNED) + " |",
        "|---" * (len(LEARNED) + 2) + "|",
    ]
    for name, s in summaries.items():
        arms = s["config"]["arms"]
        if "brh:none" not in arms:
            continue
        oracle = "brh:oracle" in arms
        cells = [
            fmt(
                median_ratio(s, "brh:oracle", "brh:none", "steady_mean_imbalance")
                if oracle
                else None
            )
        ]
        for e in LEARNED:
            arm = f"brh:{e}{suffix}"
            r = median_ratio(s, arm, "brh:none", "steady_mean_imbalance") if arm in arms else None
            g = gap_closed(s, arm) if r is not None and oracle else None
            cells.append(fmt(r) + ("" if g is None else f" ({g:.2f})"))
        rows.append(f"| {label(s, name)} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def scaling_table(summary: dict, ref: str) -> str:
    """Steady imbalance and throughput ratios to ``ref`` at every G of a multi-G run."""
    gs = [str(g) for g in summary["config"]["workers"]]
    head = " | ".join(f"G={g} I / tput" for g in gs)
    rows = [f"| arm | {head} |", "|---" * (len(gs) + 1) + "|"]
    for arm in summary["config"]["arms"]:
        cells = []
        for g in gs:
            a = summary["arms"][arm]["by_workers"][g]["repeats"]
            b = summary["arms"][ref]["by_workers"][g]["repeats"]

            def med(metric: str, a=a, b=b) -> float:
                return statistics.median(x[metric] / y[metric] for x, y in zip(a, b, strict=True))

            cells.append(f"{med('steady_mean_imbalance'):.3f} / {med('throughput_tok_s'):.3f}")
        rows.append(f"| `{arm}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


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
                gaps = {a: gap_closed(s, a) for a in learned_arms(s)}
                row["gap_closed_median"] = {
                    a: None if g is None else round(g, 3) for a, g in gaps.items()
                }
        out[name] = row
    return out


def repeats_of(summaries: dict[str, dict], workload: str) -> int:
    """Repeats of a workload's runs (the fewest, if they differ)."""
    return min(
        len(s["config"]["windows"]) for n, s in summaries.items() if n.startswith(workload + "-")
    )


def sections(summaries: dict[str, dict], ref: str) -> dict[str, str]:
    """The routing sections of the results document, by marker name."""
    workloads = sorted({name.rsplit("-b", 1)[0] for name in summaries})
    heads = []
    for wl in workloads:
        body = headline(summaries, wl, ref)
        if body:
            reps = repeats_of(summaries, wl)
            heads.append(f"**{wl}** (G = 8, median ratio to `{ref}` over {reps} repeats)\n\n{body}")
    scaling = [
        f"**{label(s, name).split(':')[0]}** (B = {s['config']['slots']}, ratio to `{ref}`)\n\n"
        + scaling_table(s, ref)
        for name, s in summaries.items()
        if len(s["config"]["workers"]) > 1
    ]
    parts = {
        "headline": "\n\n".join(heads),
        "value": value_table(summaries),
        "scaling": "\n\n".join(scaling),
    }
    return {name: body for name, body in parts.items() if body}  # a study without a part keeps it


def write_sections(path: Path, parts: dict[str, str]) -> None:
    """Replace the text between each ``<!-- ab-tables:NAME -->`` marker pair of ``path``."""
    text = path.read_text()
    for name, body in parts.items():
        begin, end = f"<!-- ab-tables:{name} -->", f"<!-- /ab-tables:{name} -->"
        pattern = re.compile(re.escape(begin) + ".*?" + re.escape(end), re.S)
        if not pattern.search(text):
            raise SystemExit(f"{path} has no {begin} ... {end} section")
        text = pattern.sub(lambda _m, b=begin, e=end, x=body: f"{b}\n{x}\n{e}", text)
    write_text(path, text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("root", nargs="?", default="runs/ab")
    ap.add_argument("--reference", default="count-jsq")
    ap.add_argument("--json", action="store_true", help="also print the target checks")
    ap.add_argument("--value", action="store_true", help="print the value-of-prediction table")
    ap.add_argument("--suffix", default="", help="--value: estimator arms are brh:<kind><suffix>")
    ap.add_argument("--scaling", action="store_true", help="print ratios at every G")
    ap.add_argument(
        "--intervals",
        nargs="?",
        const="steady_mean_imbalance",
        metavar="METRIC",
        help="print paired ratios to --reference with 95%% intervals and verdicts (default "
        "metric: steady_mean_imbalance), with the noise floor",
    )
    ap.add_argument(
        "--headline",
        nargs="*",
        metavar="WORKLOAD",
        help="print one compact table per workload (run folders WORKLOAD-b<B>-<mode>) instead",
    )
    ap.add_argument("--write", type=Path, help="regenerate the routing sections of this file")
    args = ap.parse_args()
    summaries = {
        p.parent.name: json.loads(p.read_text())
        for p in sorted(Path(args.root).glob("*/summary.json"))
    }
    if args.write is not None:
        write_sections(args.write, sections(summaries, args.reference))
        print(f"wrote the routing sections of {args.write} from {len(summaries)} runs")
        return
    if args.scaling:
        for name, s in summaries.items():
            if len(s["config"]["workers"]) > 1:
                print(f"**{label(s, name).split(':')[0]}** (B = {s['config']['slots']})\n")
                print(scaling_table(s, args.reference) + "\n")
        return
    if args.intervals:
        print(interval_table(summaries, args.reference, args.intervals) + "\n")
        return
    if args.value:
        print(value_table(summaries, args.suffix) + "\n")
        return
    if args.headline is not None:
        for wl in args.headline:
            reps = repeats_of(summaries, wl)
            print(f"**{wl}** (G = 8, median ratio to `{args.reference}` over {reps} repeats)\n")
            print(headline(summaries, wl, args.reference) + "\n")
        return
    for name, s in summaries.items():
        print(table(s, name, args.reference) + "\n")
    if args.json:
        print(json.dumps(checks(summaries, args.reference), indent=2))


if __name__ == "__main__":
    main()

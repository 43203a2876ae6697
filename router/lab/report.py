"""The A/B report, rendered from ``summary.json`` alone: tables in the shape of the paper's
Tables 3 and 4, the value of prediction, and fairness."""

from __future__ import annotations

from typing import Any

import numpy as np

from balanceroute.router.lab.ab import bootstrap_mean_ci

COLUMNS = (
    ("steady_mean_imbalance", "Mean I (steady)", "{:,.0f}"),
    ("mean_imbalance", "Mean I (all)", "{:,.0f}"),
    ("tpot_p95_ms", "TPOT P95 ms", "{:,.1f}"),
    ("throughput_tok_s", "Tput tok/s", "{:,.0f}"),
    ("queue_delay_p99_s", "Queue p99 s", "{:,.1f}"),
)


def main_workers(workers: list[int]) -> int:
    """The G the headline tables use: 8 (the paper's) when it was run, else the first."""
    return 8 if 8 in workers else workers[0]


def at(stats: dict[str, Any], g: int, workers: list[int]) -> dict[str, Any]:
    """An arm's statistics at ``g`` workers."""
    return stats if len(workers) == 1 else stats["by_workers"][str(g)]


def _cell(stats: dict[str, Any], key: str, fmt: str) -> str:
    value = stats.get(key)
    if value is None:
        return "n/a"
    lo, hi = stats.get("interval", {}).get(key, [value, value])
    ratio = stats.get("ratio_to_reference", {}).get(key)
    text = f"{fmt.format(value)} [{fmt.format(lo)}, {fmt.format(hi)}]"
    if ratio is not None:
        text += f" ({ratio['mean']:.3f}x)"
    return text


def table3(arms: dict[str, Any], order: list[str]) -> str:
    """One row per arm: each metric as mean [95% interval] (ratio to the reference)."""
    head = "| Arm | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    rows = [head, "|---" * (len(COLUMNS) + 1) + "|"]
    for label in order:
        cells = [_cell(arms[label], key, fmt) for key, _, fmt in COLUMNS]
        rows.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


PAIRED_COLUMNS = (
    ("steady_mean_imbalance", "Mean I (steady)"),
    ("mean_imbalance", "Mean I (all)"),
    ("tpot_p95_ms", "TPOT P95"),
    ("throughput_tok_s", "Tput"),
    ("queue_delay_p99_s", "Queue p99"),
)


def paired_cell(p: dict[str, Any] | None) -> str:
    """``ratio [low, high] verdict`` of one paired ratio."""
    if p is None:
        return "n/a"
    mark = {"better": " better", "worse": " worse"}.get(p["verdict"], " ~")
    return f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}]{mark}"


def paired_table(summary: dict[str, Any]) -> str:
    """One row per arm (and the noise floor): the paired ratio to the reference over windows,
    its 95% interval and verdict (better, worse, ~ = no difference detected)."""
    arms, ref = summary["arms"], summary["reference"]
    order = summary["config"]["arms"]
    n = len(summary["config"]["windows"])
    head = "| Arm | " + " | ".join(title for _, title in PAIRED_COLUMNS) + " |"
    rows = [
        f"Paired ratio to `{ref}` over {n} windows: geometric mean [95% t-interval on log "
        "ratios]; better / worse / ~ (no difference detected).",
        "",
        head,
        "|---" * (len(PAIRED_COLUMNS) + 1) + "|",
    ]
    entries = [(f"`{a}`", arms[a]) for a in order]
    if "noise_floor" in summary:
        entries.append(
            (f"noise floor (`{ref}`, windows shifted by one request)", summary["noise_floor"])
        )
    for name, st in entries:
        paired = st.get("paired", {})
        cells = [paired_cell(paired.get(key)) for key, _ in PAIRED_COLUMNS]
        rows.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table4(arms: dict[str, Any], order: list[str], workers: list[int]) -> str:
    """Arm x G: steady mean imbalance (ratio) / TPOT P95 / throughput."""
    head = "| Arm | " + " | ".join(f"G = {g}" for g in workers) + " |"
    rows = [head, "|---" * (len(workers) + 1) + "|"]
    for label in order:
        cells = []
        for g in workers:
            s = arms[label]["by_workers"][str(g)]
            ratio = s["ratio_to_reference"].get("steady_mean_imbalance", {}).get("mean")
            imb = s.get("steady_mean_imbalance")
            imb_text = "n/a" if imb is None else f"{imb:,.0f}"
            ratio_text = "" if ratio is None else f" ({ratio:.2f}x)"
            cells.append(
                f"{imb_text}{ratio_text} / {s['tpot_p95_ms']:.1f} / {s['throughput_tok_s']:,.0f}"
            )
        rows.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _steady(stats: dict[str, Any]) -> np.ndarray:
    return np.array([r["steady_mean_imbalance"] for r in stats["repeats"]], dtype=float)


def prediction_value(arms: dict[str, Any], order: list[str], workers: list[int]) -> str:
    """For each estimator: ``brh`` with none, with it and with the oracle, and the gap closed."""
    if "brh:none" not in arms or "brh:oracle" not in arms:
        return (
            "Add `brh:none` and `brh:oracle` arms to measure what each estimator is worth "
            "(the same router with and without prediction)."
        )
    learned = [a for a in order if a.startswith("brh:") and a not in ("brh:none", "brh:oracle")]
    lines = [
        "Steady mean imbalance of `brh` (mean over repeats [95% interval]); gap closed = "
        "(none - estimator) / (none - oracle), paired by repeat.",
        "",
        "| G | Estimator | brh:none | brh:estimator | brh:oracle | gap closed |",
        "|---|---|---|---|---|---|",
    ]
    fmt = "{:,.0f}"
    notes = []
    for g in workers:
        none = _steady(at(arms["brh:none"], g, workers))
        orc = _steady(at(arms["brh:oracle"], g, workers))
        helps = orc.mean() < none.mean()
        if not helps:
            notes.append(g)
        for label in learned:
            est = _steady(at(arms[label], g, workers))
            cells = []
            for vals in (none, est, orc):
                p, lo, hi = bootstrap_mean_ci(vals)
                cells.append(f"{fmt.format(p)} [{fmt.format(lo)}, {fmt.format(hi)}]")
            if helps:
                gap = none - orc
                closed = (none - est)[gap != 0] / gap[gap != 0]
                if closed.size:
                    p, lo, hi = bootstrap_mean_ci(closed)
                    gap_text = f"{p:.2f} [{lo:.2f}, {hi:.2f}]"
                else:
                    gap_text = "n/a"
            else:
                gap_text = "oracle does not help"
            lines.append(f"| {g} | `{label}` | " + " | ".join(cells) + f" | {gap_text} |")
    if notes:
        lines += [
            "",
            f"At G = {', '.join(map(str, notes))} the oracle is no better than no prediction: "
            "knowing which requests finish soon does not pay there.",
        ]
    return "\n".join(lines)


def render(summary: dict[str, Any]) -> str:
    """The whole ``report.md`` from a ``summary.json`` payload."""
    arms = summary["arms"]
    cfg = summary["config"]
    order = cfg["arms"]
    workers = cfg["workers"]
    g0 = main_workers(workers)
    if cfg["saturate"]:
        mode = "saturated (everything released at t = 0)"
    elif cfg.get("load"):
        mode = f"arrivals at {cfg['load']}x the estimated decode capacity"
    else:
        mode = f"arrival rate scale {cfg['rate_scale']}"
    est = cfg.get("estimators", {})
    lines = [
        "# BalanceRoute A/B replay",
        "",
        f"Workload: {cfg.get('workload_text')}. Replayed {est.get('replay_requests', 0):,} "
        f"requests in {len(cfg['windows'])} window(s) per arm, {mode}, B = {cfg['slots']}, "
        f"cost model {cfg['cost']}.",
        f"Reference arm: `{summary['reference']}`. Every arm replays identical releases "
        "(paired); intervals are 95% percentile-bootstrap intervals of the mean over repeats, "
        "ratios are paired per repeat.",
    ]
    if est.get("trained_on_the_fly"):
        lines.append(
            f"Estimators trained on the fly on the first {est['history_requests']:,} requests "
            f"(time-ordered, never replayed): {', '.join(est['trained_on_the_fly'])}."
        )
    if est.get("loaded_from_registry"):
        loaded = ", ".join(
            f"`{k}` ({v['model_uri']}, version {v['version']})"
            for k, v in est["loaded_from_registry"].items()
        )
        lines.append(f"Estimators loaded from the registry: {loaded}.")
    lines += [
        "",
        f"## Results at G = {g0} (shape of the paper's Table 3)",
        "",
        table3({k: at(v, g0, workers) for k, v in arms.items()}, order),
        "",
        *(
            ["## Paired ratios over windows", "", paired_table(summary), ""]
            if cfg.get("window_requests") is not None
            else []
        ),
        "Steady state = iterations with requests still waiting after admission; the whole-run "
        "mean includes the ramp-up and the final drain.",
        "",
        "## Value of prediction",
        "",
        prediction_value(arms, order, workers),
    ]
    if len(workers) > 1:
        lines += [
            "",
            "## Scaling with G (shape of the paper's Table 4)",
            "",
            "Cells: steady mean imbalance (ratio to the reference) / TPOT P95 ms / "
            "throughput tok/s.",
            "",
            table4(arms, order, workers),
        ]
    lines += [
        "",
        f"## Fairness (G = {g0})",
        "",
        "| Arm | p99 queue delay s | max queue delay s | most later requests that overtook one |",
        "|---|---|---|---|",
    ]
    for label in order:
        s = at(arms[label], g0, workers)
        lines.append(
            f"| `{label}` | {s['queue_delay_p99_s']:,.1f} | {s['max_queue_delay_s']:,.1f} | "
            f"{s['max_overtaken']:,.0f} |"
        )
    if cfg.get("plots"):
        lines += ["", "## Plots", ""] + [f"- `{p}`" for p in cfg["plots"]]
    return "\n".join(lines) + "\n"

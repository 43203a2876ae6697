"""The A/B report: tables in the shape of the paper's Tables 3 and 4, and the value of prediction."""

from __future__ import annotations

from typing import Any

from router.ab import ABConfig

COLUMNS = (
    ("steady_mean_imbalance", "Mean I (steady)", "{:,.0f}"),
    ("mean_imbalance", "Mean I (all)", "{:,.0f}"),
    ("tpot_p95_ms", "TPOT P95 ms", "{:,.1f}"),
    ("throughput_tok_s", "Tput tok/s", "{:,.0f}"),
    ("queue_delay_p99_s", "Queue p99 s", "{:,.1f}"),
)


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
    rule = "|---" * (len(COLUMNS) + 1) + "|"
    rows = [head, rule]
    for label in order:
        stats = arms[label]
        cells = [_cell(stats, key, fmt) for key, _, fmt in COLUMNS]
        rows.append(f"| `{label}` | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def table4(arms: dict[str, Any], order: list[str], workers: tuple[int, ...]) -> str:
    """Arm x G: steady mean imbalance / TPOT P95 / throughput, with the imbalance ratio."""
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


def prediction_value(arms: dict[str, Any], cfg: ABConfig, raw: dict[str, Any]) -> str:
    """For each learned estimator: brh with none, with it, with the oracle, and the gap closed."""
    import numpy as np

    from router.ab import bootstrap_mean_ci

    brh = [a for a in cfg.arms if a.router == "brh"]
    base = {a.estimator: a for a in brh if a.estimator == "none" and not a.options}
    oracle = {a.estimator: a for a in brh if a.estimator == "oracle" and not a.options}
    if not base or not oracle:
        return (
            "Add `brh:none` and `brh:oracle` arms (default options) to measure what each "
            "estimator is worth."
        )
    g = cfg.workers[0]
    runs = {}
    for t in raw["tasks"]:
        if t["workers"] == g:
            runs.setdefault(t["arm"], {})[t["repeat"]] = t["summary"]["steady_mean_imbalance"]
    none_l, orc_l = base["none"].label, oracle["oracle"].label
    lines = [
        f"Steady mean imbalance of `brh` at G = {g} (mean over repeats [95% interval]); gap "
        "closed = (none - estimator) / (none - oracle), paired by repeat.",
        "",
        "| Estimator | brh:none | brh:estimator | brh:oracle | gap closed |",
        "|---|---|---|---|---|",
    ]
    n_vals = np.array([runs[none_l][r] for r in sorted(runs[none_l])], dtype=float)
    o_vals = np.array([runs[orc_l][r] for r in sorted(runs[orc_l])], dtype=float)
    oracle_helps = o_vals.mean() < n_vals.mean()
    for a in brh:
        if a.estimator in ("none", "oracle") or a.options:
            continue
        e_vals = np.array([runs[a.label][r] for r in sorted(runs[a.label])], dtype=float)
        fmt = "{:,.0f}"
        cells = []
        for vals in (n_vals, e_vals, o_vals):
            p, lo, hi = bootstrap_mean_ci(vals)
            cells.append(f"{fmt.format(p)} [{fmt.format(lo)}, {fmt.format(hi)}]")
        if oracle_helps:
            closed = (n_vals - e_vals) / np.where(n_vals - o_vals == 0, np.nan, n_vals - o_vals)
            closed = closed[~np.isnan(closed)]
            p, lo, hi = bootstrap_mean_ci(closed) if closed.size else (float("nan"),) * 3
            gap = f"{p:.2f} [{lo:.2f}, {hi:.2f}]"
        else:
            gap = "oracle does not help here"
        lines.append(f"| `{a.label}` | " + " | ".join(cells) + f" | {gap} |")
    if not oracle_helps:
        lines += [
            "",
            "On this workload the oracle is no better than no prediction at all: "
            "knowing which requests finish soon does not pay here.",
        ]
    return "\n".join(lines)


def render(agg: dict[str, Any], raw: dict[str, Any], cfg: ABConfig, meta: dict[str, Any]) -> str:
    """The whole ``report.md``."""
    arms = agg["arms"]
    order = [a.label for a in cfg.arms]
    g0 = cfg.workers[0]
    mode = (
        "saturated (all released at t = 0)"
        if cfg.saturate
        else f"offered load {cfg.load}x capacity"
        if cfg.load
        else f"rate scale {cfg.rate_scale}"
    )
    info = raw["info"]
    lines = [
        "# BalanceRoute A/B replay",
        "",
        f"Workload: {meta.get('workload')}. Replayed {info['replay_requests']:,} requests in "
        f"{len(info['windows'])} window(s) per arm, {mode}, B = {cfg.slots}, "
        f"cost model {cfg.cost.as_dict()}.",
        f"Reference arm: `{agg['reference']}`. Every arm replays identical releases "
        "(paired); intervals are 95% percentile-bootstrap intervals of the mean over repeats, "
        "ratios are paired per repeat.",
    ]
    if info.get("trained_on_the_fly"):
        lines.append(
            f"Estimators trained on the fly on the first {info['history_requests']:,} "
            f"requests (time-ordered): {', '.join(info['trained_on_the_fly'])}."
        )
    if info.get("loaded_from_registry"):
        loaded = ", ".join(
            f"`{k}` ({v['model_uri']}, version {v['version']})"
            for k, v in info["loaded_from_registry"].items()
        )
        lines.append(f"Estimators loaded from the registry: {loaded}.")
    lines += [
        "",
        f"## Results at G = {g0} (shape of the paper's Table 3)",
        "",
        table3(
            {
                k: (v if len(cfg.workers) == 1 else v["by_workers"][str(g0)])
                for k, v in arms.items()
            },
            order,
        ),
        "",
        "Steady state = iterations with requests still waiting after admission; the whole-run "
        "mean includes the ramp-up and the final drain.",
        "",
        "## Value of prediction",
        "",
        prediction_value(arms, cfg, raw),
    ]
    if len(cfg.workers) > 1:
        lines += [
            "",
            "## Scaling with G (shape of the paper's Table 4)",
            "",
            "Cells: steady mean imbalance (ratio to the reference) / TPOT P95 ms / "
            "throughput tok/s.",
            "",
            table4(arms, order, cfg.workers),
        ]
    lines += [
        "",
        "## Fairness",
        "",
        "| Arm | max queue delay s | most requests that overtook one request |",
        "|---|---|---|",
    ]
    for label in order:
        s = arms[label] if len(cfg.workers) == 1 else arms[label]["by_workers"][str(g0)]
        lines.append(f"| `{label}` | {s['max_queue_delay_s']:,.1f} | {s['max_overtaken']:,.0f} |")
    if meta.get("plots"):
        lines += ["", "## Plots", ""] + [f"- `{p}`" for p in meta["plots"]]
    return "\n".join(lines) + "\n"

"""Sensitivity of BR-H (and BR-0) to every knob, with the fairness cost of each (prints JSON).

One knob at a time around a base configuration (default: the product's recommended ``brh``
defaults), on the shared Azure and Mooncake traces and the synthetic ``paper-prod`` workload,
G=8, B=32, saturated and at 1.1x the estimated decode capacity, ``--repeats`` windows or seeds.
Each point: steady-state and whole-run mean imbalance as ratios to count-JSQ and to BR-0 (the
paper's defaults), throughput ratio (paper-calibrated cost), p99 and maximum queueing delay as
ratios to count-JSQ, and the most later requests that overtook one request. Medians over
repeats (windows of 35% of a trace by default). Variants whose fairness cost matters also run
at 1.1x capacity, the others saturated only. Results are cached in ``--cache`` (JSON lines), so an interrupted study resumes.

Knobs: S_greedy, stage-1 window, R_max, the paper's beta/gamma grid (beta in {1, 24, 48, 96} at
gamma 0.9; gamma in {0.5, 0.7, 0.9, 1.0} at beta 48), horizon, auto-gamma scale, refresh
interval, cutoff vs expected projection, refill-aware projection, penalty on the max over the
horizon, the fairness cap, and the predictor (oracle, noisy oracle, none).

    .venv/bin/python benchmarks/sensitivity.py [--repeats 3] [--jobs 2] [--quick]
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from common import ROOT, Point, median, run_points

from balanceroute.router.policies.balance_route import BRH_DEFAULTS, PAPER_BRH

WORKLOADS = ("azure", "mooncake", "paper-prod")
LOADS = (None, 1.1)
# Variants whose fairness cost matters are also run at 1.1x capacity; the rest saturated only.
FAIRNESS = (
    "base",
    "base:none",
    "paper-defaults",
    "s_greedy=8",
    "s_greedy=64",
    "window=128",
    "guard=off",
    "guard=256",
    "refresh=80",
)


def variants() -> dict[str, tuple[str, str | None, dict]]:
    """name -> (router, predictor, options overriding the base)."""
    v: dict[str, tuple[str, str | None, dict]] = {
        "base": ("brh", "oracle", {}),
        "base:none": ("brh", "none", {}),
        "base:noisy-oracle(0.5)": ("brh", "noisy-oracle", {}),
        "paper-defaults": ("brh", "oracle", {"__paper__": True}),
        "paper-defaults:none": ("brh", "none", {"__paper__": True}),
    }
    for s in (8, 64):
        v[f"s_greedy={s}"] = ("brh", "oracle", {"s_greedy": s})
    for w in (8, 128):
        v[f"window={w}"] = ("brh", "oracle", {"window": w})
    for r in (2, 6):
        v[f"r_max={r}"] = ("brh", "oracle", {"r_max": r})
    for b in (1.0, 24.0, 48.0, 96.0):
        v[f"beta={b:g},gamma=0.9"] = (
            "brh",
            "oracle",
            {"beta": b, "gamma": 0.9, "auto_gamma": None},
        )
    for g in (0.5, 0.7, 0.9, 1.0):
        v[f"gamma={g:g},beta=48"] = (
            "brh",
            "oracle",
            {"gamma": g, "beta": 48.0, "auto_gamma": None},
        )
    for k in (15.0, 60.0):
        v[f"auto_gamma={k:g}"] = ("brh", "oracle", {"auto_gamma": k})
    for h in (20, 160):
        v[f"horizon={h}"] = ("brh", "oracle", {"horizon": h})
    for r in (8, 80):
        v[f"refresh={r}"] = ("brh", "oracle", {"refresh": r})
        v[f"refresh={r}:noisy-oracle(0.5)"] = ("brh", "noisy-oracle", {"refresh": r})
    v["projection=expected"] = ("brh", "oracle", {"projection": "expected"})
    v["refill=off"] = ("brh", "oracle", {"refill": False})
    v["penalty=max"] = ("brh", "oracle", {"penalty": "max"})
    v["guard=off"] = ("brh", "oracle", {"max_overtake": None})
    v["guard=256"] = ("brh", "oracle", {"max_overtake": 256})
    return v


def options_for(base: dict, opts: dict) -> tuple[tuple[str, object], ...]:
    """Every option spelled out, so cached points stay valid when the defaults change."""
    if opts.get("__paper__"):
        return tuple(sorted(PAPER_BRH.as_dict().items()))
    merged = {**base, **opts}
    return tuple(sorted(merged.items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--slots", type=int, default=32)
    ap.add_argument("--quick", action="store_true", help="base, none and paper points only")
    ap.add_argument("--window", type=float, default=0.35, help="share of a trace per repeat")
    ap.add_argument("--cache", default=str(ROOT / "runs" / "sensitivity.jsonl"))
    args = ap.parse_args()
    base = BRH_DEFAULTS.as_dict()
    table = variants()
    if args.quick:
        table = {k: v for k, v in table.items() if k.startswith(("base", "paper"))}
    refs = {"count-jsq": ("count-jsq", None, {}), "br0": ("br0", None, {})}
    points = []
    for wl in WORKLOADS:
        for load in LOADS:
            for rep in range(args.repeats):
                for name, (router, pred, opts) in {**refs, **table}.items():
                    if load is not None and name not in (*refs, *FAIRNESS):
                        continue
                    o = options_for(base, opts) if router == "brh" else ()
                    points.append(
                        Point(
                            workload=wl,
                            repeat=rep,
                            router=router,
                            estimator=pred,
                            options=o,
                            slots=args.slots,
                            load=load,
                            repeats=args.repeats,
                            tag=name,
                            window=args.window,
                        )
                    )
    results = run_points(points, Path(args.cache), jobs=args.jobs)
    cells: dict[tuple, dict[str, list]] = defaultdict(lambda: defaultdict(list))
    for rec in results:
        s = rec["summary"]
        c = cells[(rec["workload"], rec["load"], rec["tag"])]
        for key in (
            "steady_mean_imbalance",
            "mean_imbalance",
            "throughput_tok_s",
            "queue_delay_p99_s",
            "max_queue_delay_s",
            "max_overtaken",
        ):
            c[key].append(s[key] if s[key] is not None else float("nan"))
    out: dict = {"base": base, "slots": args.slots, "repeats": args.repeats, "points": {}}
    for wl in WORKLOADS:
        for load in LOADS:
            mode = "saturated" if load is None else f"load={load}"
            jsq = cells[(wl, load, "count-jsq")]
            br0 = cells[(wl, load, "br0")]
            for name in {**refs, **table}:
                c = cells[(wl, load, name)]
                if not c:
                    continue

                def ratio(key, ref, c=c):
                    return round(median(c[key]) / median(ref[key]), 4)

                out["points"].setdefault(name, {}).setdefault(wl, {})[mode] = {
                    "steady_vs_count_jsq": ratio("steady_mean_imbalance", jsq),
                    "steady_vs_br0": ratio("steady_mean_imbalance", br0),
                    "all_vs_count_jsq": ratio("mean_imbalance", jsq),
                    "throughput_vs_count_jsq": ratio("throughput_tok_s", jsq),
                    "p99_wait_vs_count_jsq": ratio("queue_delay_p99_s", jsq),
                    "max_wait_vs_count_jsq": ratio("max_queue_delay_s", jsq),
                    "max_overtaken": median(c["max_overtaken"]),
                }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

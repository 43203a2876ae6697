"""Router cost per routing call in steady state (prints JSON).

The decode tier runs saturated with a waiting pool held near ``--pool`` requests: request ``i``
is released when request ``i - pool`` was admitted in a first count-JSQ pass, so every routing
call sees a realistic pool. Policies run alternately ``--runs`` times; figures are medians of
the per-run medians and p99s, and ratios are taken run by run (the machine is shared and noisy).
The completion hook (projection upkeep when requests finish) is charged to the routing call.

Arms: ``brh`` is the recommended configuration (predictions refreshed every iteration),
``brh-refresh8`` the same refreshed every 8, ``brh-paper`` the paper's (every 80); all with
the oracle estimator, whose prediction cost is a few array lookups. ``brh:none`` is the same
router without prediction, and ``brh:survival``, ``brh:exactmatch``, ``brh:gbdt``,
``brh:hazard`` the learned estimators (trained on the first 30% of the trace, which is then not
replayed), predictions every iteration; ``ratio_to_brh_none_median`` compares each with
``brh:none`` run by run.

Targets: (issue 3) at G=8, B=64, H=80, R_max=4 with a pool of 256, BR-H median <= 100 us,
p99 <= 400 us and <= 1.5x count-JSQ's median; at G=128 median <= 2 ms. (issue 14) with any
learned estimator, median <= 500 us at G=8, B=64 and <= 2x ``brh:none``'s median. (issue 19)
an arm ``NAME+twin`` runs beside the live decode twin: its routing median must stay that of
``NAME`` (the twin works off the routing path), and the twin's CPU per 1,000 iterations and its
share of one core at 60 ms iterations are reported (target <= 5%).

    .venv/bin/python benchmarks/perf/router_latency.py [--runs 3] [--pool 256]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.loaders import load_trace
from balanceroute.features.schema import to_arrays
from balanceroute.features.split import time_split
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import build_estimator
from balanceroute.router.lab.prefill import PrefillConfig, release
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.lab.twin.config import TwinGroup
from balanceroute.router.lab.twin.driver import attach_twin
from balanceroute.router.policies.baselines import CountJSQPolicy
from balanceroute.router.policies.specs import RouterSpec

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
ARMS = {
    "count-jsq": "count-jsq",
    "br0": "br0",
    "brh": "brh:oracle",
    "brh-refresh8": "brh:oracle{refresh=8}",
    "brh-paper": "brh-paper:oracle",
    "brh:none": "brh:none",
    "brh:survival": "brh:survival",
    "brh:exactmatch": "brh:exactmatch",
    "brh:gbdt": "brh:gbdt",
    "brh:hazard": "brh:hazard",
}
LEARNED = ("brh:survival", "brh:exactmatch", "brh:gbdt", "brh:hazard")


def arm_spec(name: str) -> str:
    """The spec string of an arm: a name of ``ARMS``, or any spec (``brh:gbdt{guard=false}``)."""
    return ARMS.get(name, name)


def pooled_releases(frame, workers: int, slots: int, pool: int):
    """Releases that keep about ``pool`` requests waiting (from a count-JSQ pass)."""
    rq = release(to_arrays(frame), PrefillConfig(saturate=True))
    first = simulate(
        rq, CountJSQPolicy(), SimConfig(workers=workers, slots=slots, record_loads=False)
    )
    admit = first.admit_s  # FCFS: admission times are non-decreasing in release order
    rel = np.zeros(rq.size)
    rel[pool:] = admit[: rq.size - pool]
    return replace(rq, release_s=np.maximum.accumulate(rel))


def fitted_estimators(history, arms):
    """The learned arms' estimators, fitted once on ``history`` (copied for every run)."""
    out = {}
    for a in dict.fromkeys(a.removesuffix(TWIN) for a in arms):
        spec = RouterSpec.parse(arm_spec(a))
        if spec.estimator is not None and spec.estimator.needs_history:
            out[a] = build_estimator(
                spec.estimator, history=history, horizon=spec.horizon or DEFAULT_HORIZON
            )
    return out


TWIN = "+twin"  # an arm name ending so runs beside the decode twin (router/lab/twin/)
ITERATION_S = 0.060  # a real decode iteration, for the twin's share of one core


def run_arm(name, rq, frame, workers, slots, fitted, twin_cost=None):
    """Median and p99 routing-call time of one run; ``name + TWIN`` attaches the live twin
    (off the routing path) and adds its CPU to ``twin_cost``."""
    twin = name.endswith(TWIN)
    base = name[: -len(TWIN)] if twin else name
    spec = RouterSpec.parse(arm_spec(base))
    name = base if twin and base in fitted else name
    est = None
    if name in fitted:
        est = copy.deepcopy(fitted[name])  # online updates must not leak between runs
    elif spec.estimator is not None:
        est = build_estimator(spec.estimator, replay=frame, horizon=spec.horizon or DEFAULT_HORIZON)
    policy = spec.build_policy(est)
    if twin:
        policy = attach_twin(policy, TwinGroup(spec, workers, slots), rq)
    res = simulate(rq, policy, SimConfig(workers=workers, slots=slots, record_loads=False))
    if twin and twin_cost is not None:
        twin_cost.append((res.extras.get("twin_cpu_s", 0.0), res.iterations))
    us = res.router_ns[1:] / 1e3  # the first call loads compiled kernels
    return float(np.median(us)), float(np.percentile(us, 99))


def ratio(values, base):
    """Median of the run-by-run ratios."""
    return round(statistics.median([x / b for x, b in zip(values, base, strict=True)]), 2)


def study(frame, workers, slots, pool, runs, arms):
    fitted = {}
    if any(
        RouterSpec.parse(arm_spec(a.removesuffix(TWIN))).estimator is not None
        and RouterSpec.parse(arm_spec(a.removesuffix(TWIN))).estimator.needs_history
        for a in arms
    ):
        history, frame = time_split(frame, 0.3, rebase_tail=True)
        fitted = fitted_estimators(history, arms)
    rq = pooled_releases(frame, workers, slots, pool)
    med = {a: [] for a in arms}
    p99 = {a: [] for a in arms}
    cost = {a: [] for a in arms}
    for _ in range(runs):
        for a in arms:
            m, p = run_arm(a, rq, frame, workers, slots, fitted, cost[a])
            med[a].append(m)
            p99[a].append(p)
    out = {"workers": workers, "slots": slots, "pool": pool, "requests": len(frame)}
    for a in arms:
        out[a] = {
            "median_us": round(statistics.median(med[a]), 1),
            "p99_us": round(statistics.median(p99[a]), 1),
            "ratio_to_count_jsq_median": ratio(med[a], med["count-jsq"]),
        }
        if "brh:none" in arms and a.startswith("brh:"):
            out[a]["ratio_to_brh_none_median"] = ratio(med[a], med["brh:none"])
        if cost[a]:
            cpu = sum(c for c, _ in cost[a])
            its = sum(k for _, k in cost[a])
            out[a]["twin_cpu_s_per_1000_iterations"] = round(1000 * cpu / its, 3)
            out[a]["twin_core_share_at_60ms"] = round(cpu / (its * ITERATION_S), 4)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--pool", type=int, default=256)
    ap.add_argument(
        "--arms",
        default=",".join(ARMS),
        help="comma-separated arms at G=8 (names above, or spec strings; ';' inside braces)",
    )
    ap.add_argument("--no-g128", action="store_true", help="skip the G=128 study")
    args = ap.parse_args()
    arms = args.arms.split(",")
    if "count-jsq" not in arms:
        arms.insert(0, "count-jsq")
    azure = DATA / "azure_llm_2023_conv.csv"
    frame = load_trace(azure) if azure.exists() else generate("azure-conv", 20_000, seed=0)
    out = {
        "load_average": os.getloadavg()[0],
        "g8": study(frame, 8, 64, args.pool, args.runs, arms),
    }
    if not args.no_g128:
        big = generate("azure-conv", 60_000, seed=1)
        out["g128"] = study(
            big, 128, 64, args.pool, max(1, args.runs - 1), ["count-jsq", "br0", "brh", "brh-paper"]
        )
    out["load_average_after"] = os.getloadavg()[0]
    out["targets"] = {
        "g8_brh_median_us": 100,
        "g8_brh_p99_us": 400,
        "g8_brh_ratio_to_count_jsq": 1.5,
        "g128_brh_median_us": 2000,
        "g8_learned_median_us": 500,
        "g8_learned_ratio_to_brh_none": 2.0,
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

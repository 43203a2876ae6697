"""``balanceroute simulate``: replay a workload through one router on a simulated decode tier."""

from __future__ import annotations

import argparse
import sys

from balanceroute.cli.options import (
    DEFAULT_TRAIN_FRACTION,
    add_alias,
    add_router_option_args,
    add_tier_args,
    add_workload_args,
    bounded_float,
    cost_from_args,
    fraction,
    prefill_from_args,
    router_options,
    workers_count,
    workload_from_args,
)
from balanceroute.features.files import output_folder
from balanceroute.features.workload import load_workload
from balanceroute.predict.factory import EstimatorSpec
from balanceroute.router.lab.runner import RemoteSpec, ReplaySpec, simulate_workload
from balanceroute.router.policies.registry import policy_names
from balanceroute.router.policies.specs import RouterSpec

SHOWN = (
    "mean_imbalance",
    "steady_mean_imbalance",
    "throughput_tok_s",
    "tpot_p95_ms",
    "queue_delay_p99_s",
    "router_step_us_p50",
    "iterations",
    "sim_wall_s",
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``simulate`` to the root parser."""
    p = sub.add_parser(
        "simulate",
        help="replay a trace through one router on a simulated decode tier",
        description="Replay requests through a router on G decode workers with B slots each and "
        "write DIR/summary.json (metrics and the resolved configuration), "
        "DIR/iterations.parquet (per-iteration loads) and DIR/requests.parquet (timings).",
    )
    add_workload_args(p)
    p.add_argument("--router", default="count-jsq", choices=policy_names())
    p.add_argument(
        "--estimator",
        help="completion estimator of brh: none (default), oracle, noisy-oracle, posterior, "
        "survival, exactmatch, gbdt, hazard, histogram (AIBrix), osl-hint (Dynamo)",
    )
    add_alias(p, "--predictor", "--estimator", "estimator")
    p.add_argument(
        "--model-uri",
        help="load the estimator (e.g. models:/completion-predictor@gbdt or a .joblib file) "
        "instead of training it",
    )
    p.add_argument(
        "--train-fraction",
        type=fraction,
        default=DEFAULT_TRAIN_FRACTION,
        help="estimators that learn from history, without --model-uri, train on this earlier "
        "share of the trace and the rest is replayed",
    )
    p.add_argument("--estimator-url", help="get predictions from a running balanceroute serve")
    add_alias(p, "--predictor-url", "--estimator-url", "estimator_url")
    p.add_argument(
        "--estimator-timeout",
        type=bounded_float(0, 60),
        default=0.02,
        help="seconds before a remote prediction falls back locally",
    )
    add_alias(
        p,
        "--predictor-timeout",
        "--estimator-timeout",
        "estimator_timeout",
        type=bounded_float(0, 60),
    )
    p.add_argument("--workers", type=workers_count, default=8, help="G: workers in the group")
    add_tier_args(p)
    add_router_option_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_simulate)


def cmd_simulate(args: argparse.Namespace) -> int:
    """Replay, write the records and the summary, print the headline figures."""
    frame, source = load_workload(workload_from_args(args))
    estimator = None
    if args.estimator is not None or args.model_uri is not None:
        estimator = EstimatorSpec(args.estimator or "none", args.model_uri)
    spec = ReplaySpec(
        router=RouterSpec(args.router, estimator, router_options(args)),
        workers=args.workers,
        slots=args.slots,
        seed=args.seed,
        cost=cost_from_args(args),
        prefill=prefill_from_args(args),
        load=args.load,
    )
    remote = RemoteSpec(args.estimator_url, args.estimator_timeout) if args.estimator_url else None
    out = output_folder(args.out)
    summary = simulate_workload(
        frame,
        source,
        spec,
        out,
        train_fraction=args.train_fraction,
        remote=remote,
        progress=sys.stderr.isatty(),
        log=lambda message: print(message, file=sys.stderr),
    )
    for key in SHOWN:
        value = summary[key]
        print(f"{key:>24}: {value:,.3f}" if isinstance(value, float) else f"{key:>24}: {value}")
    print(f"wrote {out / 'summary.json'}")
    return 0

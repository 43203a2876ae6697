"""``balanceroute ab``: paired A/B replay of routers and estimators, with a report."""

from __future__ import annotations

import argparse
import sys
import time

from balanceroute.cli.options import (
    MAX_WORKERS,
    add_tier_args,
    add_workload_args,
    bounded_int,
    cost_from_args,
    fraction,
    workload_from_args,
)
from balanceroute.features.files import output_folder
from balanceroute.features.workload import load_workload
from balanceroute.router.lab.ab import (
    DEFAULT_WINDOWS,
    ABConfig,
    default_window_requests,
    progress_printer,
)
from balanceroute.router.policies.specs import parse_arms
from balanceroute.training.experiments import EXPERIMENT, run_ab_experiment

DEFAULT_TRAIN_FRACTION = 0.3


def worker_counts(text: str) -> tuple[int, ...]:
    """argparse type: G, or several separated by commas (``4,8,16``), each at least 1."""
    try:
        counts = tuple(int(g) for g in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected integers separated by commas, got {text!r}"
        ) from None
    if not counts or min(counts) < 1 or max(counts) > MAX_WORKERS:
        raise argparse.ArgumentTypeError(
            f"every G must be between 1 and {MAX_WORKERS:,}, got {text!r}"
        )
    return counts


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``ab`` to the root parser."""
    p = sub.add_parser(
        "ab",
        help="paired A/B replay of routers and estimators, with a report",
        description="Replay the same requests under several arms (router[:estimator[@uri]]"
        "[{option=value;...}]) and write DIR/summary.json, DIR/report.md and plots; logs a "
        "parent MLflow run with a child run per arm.",
    )
    add_workload_args(p)
    p.add_argument(
        "--arms",
        required=True,
        help="comma-separated arms, e.g. count-jsq,token-jsq,br0,brh:none,brh:survival,brh:oracle",
    )
    p.add_argument("--workers", type=worker_counts, default=(8,), help="G, or several: 4,8,16")
    p.add_argument(
        "--windows",
        type=bounded_int(2, 1000),
        help=f"paired windows of --window-requests requests (default {DEFAULT_WINDOWS}, unless "
        "--repeats is given)",
    )
    p.add_argument(
        "--window-requests",
        type=bounded_int(2, 10_000_000),
        help="requests per window (default: 4 G B, at least 400)",
    )
    p.add_argument(
        "--no-noise-floor",
        action="store_true",
        help="do not replay the reference on windows shifted by one request",
    )
    p.add_argument(
        "--repeats",
        type=bounded_int(1, 1000),
        help="the older scheme: this many windows of --window-fraction of the replayed trace",
    )
    p.add_argument(
        "--window-fraction",
        type=fraction,
        default=0.5,
        help="share of the replayed part each repeat covers (with --repeats > 1)",
    )
    p.add_argument(
        "--train-fraction",
        type=fraction,
        default=DEFAULT_TRAIN_FRACTION,
        help="earlier share of the trace that trains on-the-fly estimators",
    )
    p.add_argument("--reference", help="reference arm for ratios (default count-jsq or first)")
    p.add_argument("--jobs", type=bounded_int(1, 256), default=1, help="parallel processes")
    p.add_argument("--dask-scheduler", help="run on an existing Dask cluster at this address")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    add_tier_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_ab)


def cmd_ab(args: argparse.Namespace) -> int:
    """Run the experiment, print the headline table and where everything went."""
    started = time.perf_counter()
    windowed = args.repeats is None or args.windows is not None or args.window_requests
    repeats = args.windows or args.repeats or DEFAULT_WINDOWS
    window_requests = None
    if windowed:
        window_requests = args.window_requests or default_window_requests(args.workers, args.slots)
    cfg = ABConfig(
        arms=tuple(parse_arms(args.arms)),
        workers=args.workers,
        slots=args.slots,
        repeats=repeats,
        window_requests=window_requests,
        noise_floor=bool(windowed) and not args.no_noise_floor,
        window_fraction=args.window_fraction,
        train_fraction=args.train_fraction,
        seed=args.seed,
        saturate=args.saturate,
        rate_scale=args.rate_scale if args.load is None else 1.0,
        load=args.load,
        cost=cost_from_args(args),
        reference=args.reference,
    )
    cfg.reference_arm()
    frame, source = load_workload(workload_from_args(args))
    out = output_folder(args.out)
    done = run_ab_experiment(
        frame,
        source,
        cfg,
        out,
        jobs=args.jobs,
        dask_scheduler=args.dask_scheduler,
        track=not args.no_mlflow,
        progress=progress_printer,
    )
    if done.run_id is not None:
        print(f"logged to MLflow run {done.run_id} (experiment {EXPERIMENT})", file=sys.stderr)
    if done.tracking_error is not None:
        print(
            f"balanceroute ab: warning: MLflow logging failed ({done.tracking_error}); "
            f"results are in {out}",
            file=sys.stderr,
        )
    print(done.results.headline_table)
    files = ", ".join(str(p) for p in done.results.files)
    print(f"\nwrote {files} in {time.perf_counter() - started:.0f} s")
    return 0

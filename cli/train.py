"""``balanceroute train``: fit, evaluate, track and register completion estimators."""

from __future__ import annotations

import argparse
import json

from balanceroute.cli.options import (
    add_workload_args,
    bounded_int,
    fraction,
    horizon_count,
    positive_float,
    workload_from_args,
)
from balanceroute.features.constants import DEFAULT_HORIZON, MAX_SLOTS, MAX_WORKERS
from balanceroute.features.keys import AUTO_KEY, KEY_SOURCES
from balanceroute.predict.learned import WEIGHTINGS
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME
from balanceroute.router.lab.twin.prior import DEFAULT_PRIOR_WINDOWS, PriorConfig
from balanceroute.training.crossfit import MAX_FOLDS
from balanceroute.training.tracking import DEFAULT_ESTIMATORS, DEFAULT_EXPERIMENT
from balanceroute.training.train import DEFAULT_PRIOR_FOLDS, TrainConfig, run_train


def kinds(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated estimator kinds."""
    return tuple(k.strip() for k in text.split(",") if k.strip())


def groups(text: str) -> tuple[tuple[int, int], ...]:
    """argparse type: comma-separated group shapes ``GxB`` (``8x32,8x64``)."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        g, sep, b = part.lower().partition("x")
        if not sep or not g.isdigit() or not b.isdigit():
            raise argparse.ArgumentTypeError(f"expected shapes like 8x32,8x64, got {part!r}")
        shape = (int(g), int(b))
        if not (1 <= shape[0] <= MAX_WORKERS and 1 <= shape[1] <= MAX_SLOTS):
            raise argparse.ArgumentTypeError(
                f"{part}: G must be in 1..{MAX_WORKERS} and B in 1..{MAX_SLOTS}"
            )
        out.append(shape)
    return tuple(out)


def add_key_arg(parser: argparse.ArgumentParser) -> None:
    """``--key``: the prompt-key source of exactmatch."""
    parser.add_argument(
        "--key",
        default=AUTO_KEY,
        choices=[AUTO_KEY, *KEY_SOURCES],
        help="exactmatch key source (auto: hash if the trace has prompt keys, else exact-length)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` to the root parser."""
    p = sub.add_parser("train", help="train, evaluate, track and register completion estimators")
    add_workload_args(p)
    add_key_arg(p)
    p.add_argument(
        "--horizon", type=horizon_count, default=DEFAULT_HORIZON, help="lookahead H in iterations"
    )
    p.add_argument(
        "--estimators",
        type=kinds,
        default=DEFAULT_ESTIMATORS,
        help="comma-separated estimator kinds (default survival,exactmatch,gbdt)",
    )
    p.add_argument(
        "--weighting",
        choices=WEIGHTINGS,
        help="training rows of gbdt and hazard weighted by time at risk (each request by its "
        "running time, as a router meets it) or per request (default: each estimator's own)",
    )
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    p.add_argument(
        "--register-as", default=DEFAULT_MODEL_NAME, help="registered model receiving the versions"
    )
    p.add_argument(
        "--train-fraction",
        type=fraction,
        default=0.7,
        help="earlier share of the trace that fits the estimators scored on the rest (the "
        "holdout); the registered models are fitted on the whole trace (default 0.7)",
    )
    p.add_argument(
        "--twin-group",
        type=groups,
        default=((8, 32),),
        help="group shapes GxB the twin's prior is measured on (default 8x32; a consumer's "
        "twin uses the prior of its own shape only)",
    )
    p.add_argument(
        "--twin-load",
        type=positive_float,
        help="offered load (x capacity) of the prior's replays (default: saturated)",
    )
    p.add_argument(
        "--twin-windows",
        type=bounded_int(2, 1000),
        default=DEFAULT_PRIOR_WINDOWS,
        help="windows the prior replays, shared between its folds, at most (default "
        f"{DEFAULT_PRIOR_WINDOWS}; a fold replays no more than cover it about twice, the live "
        "twin's own block spacing)",
    )
    p.add_argument(
        "--prior-folds",
        type=bounded_int(1, MAX_FOLDS),
        default=DEFAULT_PRIOR_FOLDS,
        help="cross-fitted folds in time of the whole trace the twin's prior replays, each by a "
        f"copy fitted on the others (default {DEFAULT_PRIOR_FOLDS}; 1: the holdout only, "
        "replayed by the copy fitted on the earlier part)",
    )
    p.add_argument("--no-twin-prior", action="store_true", help="measure and keep no twin prior")
    p.add_argument("--out", help="local artifact folder (default ./artifacts/models/<run>)")
    p.add_argument(
        "--promote",
        action="store_true",
        help="make this run's best estimator the champion even if it does not beat the current "
        "champion on this run's holdout",
    )
    p.set_defaults(func=cmd_train)


def cmd_train(args: argparse.Namespace) -> int:
    """Train and print where the models went and how they scored."""
    cfg = TrainConfig(
        workload=workload_from_args(args),
        horizon=args.horizon,
        estimators=args.estimators,
        key=args.key,
        experiment=args.experiment,
        register_as=args.register_as,
        out=args.out,
        promote=args.promote,
        weighting=args.weighting,
        train_fraction=args.train_fraction,
        prior_folds=args.prior_folds,
        twin_priors=()
        if args.no_twin_prior
        else tuple(
            PriorConfig(workers=g, slots=b, load=args.twin_load, windows=args.twin_windows)
            for g, b in args.twin_group
        ),
    )
    summary = run_train(cfg)
    brief = {k: summary[k] for k in ("run_name", "local_dir", "registry", "metrics", "twin_priors")}
    print(json.dumps(brief, indent=2, default=str))
    return 0

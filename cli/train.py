"""``balanceroute train``: fit, evaluate, track and register completion estimators."""

from __future__ import annotations

import argparse
import json

from balanceroute.cli.options import add_workload_args, horizon_count, workload_from_args
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.keys import AUTO_KEY, KEY_SOURCES
from balanceroute.predict.learned import WEIGHTINGS
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME
from balanceroute.training.tracking import DEFAULT_ESTIMATORS, DEFAULT_EXPERIMENT
from balanceroute.training.train import TrainConfig, run_train


def kinds(text: str) -> tuple[str, ...]:
    """argparse type: comma-separated estimator kinds."""
    return tuple(k.strip() for k in text.split(",") if k.strip())


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
    )
    summary = run_train(cfg)
    brief = {k: summary[k] for k in ("run_name", "local_dir", "registry", "metrics")}
    print(json.dumps(brief, indent=2, default=str))
    return 0

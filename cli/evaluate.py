"""``balanceroute evaluate``: score saved or registered estimators on a trace's holdout."""

from __future__ import annotations

import argparse
from pathlib import Path

from balanceroute.cli.options import (
    add_dataclass_args,
    add_workload_args,
    given_fields,
    horizon_count,
    workload_from_args,
)
from balanceroute.cli.train import add_key_arg, kinds
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME
from balanceroute.training.evaluate import EvaluateConfig, metrics_table, run_evaluate
from balanceroute.training.replay_scores import ReplayScoreConfig

REPLAY_DEST = "replay_"


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``evaluate`` to the root parser."""
    p = sub.add_parser("evaluate", help="score estimators on the time-ordered holdout")
    add_workload_args(p)
    add_key_arg(p)
    model = p.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-uri", help="models:/..., runs:/..., an alias, or a .joblib file")
    model.add_argument(
        "--estimator",
        type=kinds,
        help="kind(s) to load by alias from the registered model (e.g. gbdt or survival,gbdt)",
    )
    p.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="registered model for aliases")
    p.add_argument(
        "--horizon", type=horizon_count, default=DEFAULT_HORIZON, help="lookahead H in iterations"
    )
    p.add_argument(
        "--warmup",
        action="store_true",
        help="observe the training part first (for a model fitted on another trace)",
    )
    p.add_argument("--out", required=True, help="folder for metrics.json and plots")
    group = p.add_argument_group("replay scores (brh on the holdout's requests)")
    add_dataclass_args(group, ReplayScoreConfig, dest_prefix=REPLAY_DEST)
    p.set_defaults(func=cmd_evaluate)


def cmd_evaluate(args: argparse.Namespace) -> int:
    """Evaluate, print the metrics as a table (all of them are in metrics.json), then the
    recommendation line."""
    given = given_fields(args, ReplayScoreConfig, dest_prefix=REPLAY_DEST)
    metrics, rec = run_evaluate(
        EvaluateConfig(
            workload=workload_from_args(args),
            out=Path(args.out),
            model_uri=args.model_uri,
            kinds=args.estimator or (),
            model_name=args.model_name,
            horizon=args.horizon,
            warmup=args.warmup,
            key=args.key,
            replay=ReplayScoreConfig(**given),
        )
    )
    print(metrics_table(metrics))
    print(f"\nwrote {Path(args.out) / 'metrics.json'} (every metric, by age too) and plots")
    print(rec.line())
    return 0

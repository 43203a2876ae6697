"""``balanceroute train`` and ``balanceroute evaluate``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from balanceroute.predict.keys import AUTO_KEY, KEY_SOURCES
from balanceroute.training.tracking import (
    DEFAULT_ESTIMATORS,
    DEFAULT_EXPERIMENT,
    DEFAULT_MODEL_NAME,
)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _kinds(text: str) -> tuple[str, ...]:
    return tuple(k.strip() for k in text.split(",") if k.strip())


def _workload_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", help="trace file (Azure, Mooncake, BurstGPT or canonical)")
    src.add_argument(
        "--preset", help="synthetic preset when no trace is given (default paper-prod)"
    )
    p.add_argument("--requests", type=_positive, help="use the first N requests (or generate N)")
    p.add_argument("--seed", type=int, default=0, help="seed of the preset and of the sampling")
    p.add_argument(
        "--key-blocks", type=_positive, default=2, help="Mooncake: hash blocks in the key"
    )
    p.add_argument(
        "--key",
        default=AUTO_KEY,
        choices=[AUTO_KEY, *KEY_SOURCES],
        help="exactmatch key source (auto: hash if the trace has prompt keys, else exact-length)",
    )


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``train`` and ``evaluate`` to the root parser."""
    train = sub.add_parser(
        "train", help="train, evaluate, track and register completion estimators"
    )
    _workload_args(train)
    train.add_argument("--horizon", type=_positive, default=80, help="lookahead H in iterations")
    train.add_argument(
        "--estimators",
        type=_kinds,
        default=DEFAULT_ESTIMATORS,
        help="comma-separated estimator kinds (default survival,exactmatch,gbdt)",
    )
    train.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    train.add_argument(
        "--register-as", default=DEFAULT_MODEL_NAME, help="registered model receiving the versions"
    )
    train.add_argument("--out", help="local artifact folder (default ./artifacts/models/<run>)")
    train.set_defaults(func=_train)

    ev = sub.add_parser("evaluate", help="score estimators on the time-ordered holdout")
    _workload_args(ev)
    model = ev.add_mutually_exclusive_group(required=True)
    model.add_argument("--model-uri", help="models:/..., runs:/..., an alias, or a .joblib file")
    model.add_argument(
        "--estimator",
        type=_kinds,
        help="kind(s) to load by alias from the registered model (e.g. gbdt or survival,gbdt)",
    )
    ev.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="registered model for aliases")
    ev.add_argument("--horizon", type=_positive, default=80, help="lookahead H in iterations")
    ev.add_argument(
        "--warmup",
        action="store_true",
        help="observe the training part first (for a model fitted on another trace)",
    )
    ev.add_argument("--out", required=True, help="folder for metrics.json and plots")
    ev.set_defaults(func=_evaluate)


def _train(args: argparse.Namespace) -> int:
    from balanceroute.training.train import TrainConfig, run_train

    cfg = TrainConfig(
        trace=args.trace,
        preset=args.preset,
        requests=args.requests,
        seed=args.seed,
        key_blocks=args.key_blocks,
        horizon=args.horizon,
        estimators=args.estimators,
        key=args.key,
        experiment=args.experiment,
        register_as=args.register_as,
        out=args.out,
    )
    summary = run_train(cfg)
    print(
        json.dumps(
            {k: summary[k] for k in ("run_name", "local_dir", "registry", "metrics")},
            indent=2,
            default=str,
        )
    )
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from balanceroute.training.evaluate_cli import run_evaluate

    metrics = run_evaluate(
        trace=args.trace,
        preset=args.preset,
        requests=args.requests,
        seed=args.seed,
        key_blocks=args.key_blocks,
        model_uri=args.model_uri,
        kinds=args.estimator,
        model_name=args.model_name,
        horizon=args.horizon,
        warmup=args.warmup,
        key=args.key,
        out=Path(args.out),
    )
    brief = {k: {m: v for m, v in d.items() if m != "by_age"} for k, d in metrics.items()}
    print(json.dumps(brief, indent=2))
    return 0

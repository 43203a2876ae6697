"""``balanceroute pipeline``: the learning loop, one cycle (``--once``) or every ``--loop``."""

from __future__ import annotations

import argparse
import json

from balanceroute.cli.options import bounded_int, duration, fraction, horizon_count, positive_int
from balanceroute.cli.train import groups, kinds
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME
from balanceroute.training.pipeline import PipelineConfig, run_cycle, run_loop
from balanceroute.training.reload_targets import Target
from balanceroute.training.tracking import DEFAULT_ESTIMATORS, DEFAULT_EXPERIMENT
from balanceroute.training.twin_judge import PRIOR_WINDOWS

EPILOG = (
    "exit codes: 0 promoted or nothing to do (stdout says which), 10 the candidate is not "
    "better than the champion, 11 the twin judges it harmful, 2 bad input (the log, flags), "
    "3 tracking store, 4 a reload target, 5 another step failed; on any failure no alias moved"
)


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``pipeline`` to the root parser."""
    p = sub.add_parser(
        "pipeline",
        help="one learning cycle: completion log -> candidates -> judge -> champion -> reload",
        epilog=EPILOG,
    )
    p.add_argument("--log", required=True, help="completion log folder (gateway --out DIR/completions) or trace file")
    p.add_argument("--window-rows", type=positive_int, default=20_000, help="recent requests the cycle reads (20000)")
    p.add_argument("--window-age", type=duration, help="only requests within this age of the last one (e.g. 6h)")
    p.add_argument("--min-new-rows", type=positive_int, default=500, help="requests newer than the champion's window needed to run (500)")
    p.add_argument("--holdout-fraction", type=fraction, default=0.3, help="latest share of the window the candidates are judged on, at most (0.3)")
    p.add_argument("--estimators", type=kinds, default=DEFAULT_ESTIMATORS, help="candidate kinds (survival,exactmatch,gbdt)")
    p.add_argument("--horizon", type=horizon_count, default=DEFAULT_HORIZON, help="lookahead H")
    p.add_argument("--group", type=groups, default=((8, 32),), help="the group shape GxB the twin judges on (8x32)")
    p.add_argument("--twin-windows", type=bounded_int(2, 1000), default=PRIOR_WINDOWS, help=f"windows of the twin's prior, at most ({PRIOR_WINDOWS}; no more than cover the judge slice about twice)")
    p.add_argument("--experiment", default=DEFAULT_EXPERIMENT, help="MLflow experiment")
    p.add_argument("--register-as", default=DEFAULT_MODEL_NAME, help="registered model")
    p.add_argument("--gateway", action="append", default=[], metavar="URL", help="a gateway to reload after a promotion (repeatable)")
    p.add_argument("--service", action="append", default=[], metavar="URL", help="a prediction service to reload (repeatable)")
    p.add_argument("--out", help="local artifact folder of the cycle (default ./artifacts/models/<run>)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--once", action="store_true", help="run one cycle and exit (default)")
    mode.add_argument("--loop", type=duration, metavar="PERIOD", help="run a cycle every PERIOD until SIGTERM")
    p.set_defaults(func=cmd_pipeline)  # fmt: skip


def cmd_pipeline(args: argparse.Namespace) -> int:
    """Run the cycle (or loop); print the cycle's result as JSON; return its exit code."""
    if len(args.group) != 1:
        raise UserError("--group takes one shape GxB")
    targets = tuple(Target("gateway", u) for u in args.gateway)
    targets += tuple(Target("service", u) for u in args.service)
    cfg = PipelineConfig(
        log=args.log,
        window_rows=args.window_rows,
        max_age_s=args.window_age,
        min_new_rows=args.min_new_rows,
        holdout_fraction=args.holdout_fraction,
        estimators=args.estimators,
        horizon=args.horizon,
        experiment=args.experiment,
        register_as=args.register_as,
        group=args.group[0],
        twin_windows=args.twin_windows,
        targets=targets,
        out=args.out,
    )
    if args.loop is not None:
        return run_loop(cfg, args.loop)
    result = run_cycle(cfg)
    print(json.dumps(result.as_dict(), indent=2, default=str))
    return result.outcome.exit_code

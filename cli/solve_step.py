"""``balanceroute solve-step``: one routing step solved exactly beside the heuristic."""

from __future__ import annotations

import argparse
import json

from balanceroute.cli.options import bounded_float, bounded_int
from balanceroute.features.files import jsonable
from balanceroute.serving.service.solve import solve_posted_step


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``solve-step`` to the root parser."""
    p = sub.add_parser(
        "solve-step",
        help="solve one routing step exactly (MILP) beside the heuristic's decision",
        description="Read a state in the POST /v1/route body format, run the named BalanceRoute "
        "policy on it, solve IO_H exactly over the same candidates with HiGHS, and print both "
        "decisions, their discounted projected imbalance and the gap (small instances only).",
    )
    p.add_argument("--state", required=True, help="JSON file: a /v1/route request body")
    p.add_argument("--model-uri", help="completion estimator for brh (default: none)")
    p.add_argument(
        "--candidates",
        type=bounded_int(0, 64),
        default=0,
        help="consider at least this many waiting requests (default: the window)",
    )
    p.add_argument(
        "--time-limit", type=bounded_float(0, 3600), default=30.0, help="MILP time limit, seconds"
    )
    p.set_defaults(func=cmd_solve_step)


def cmd_solve_step(args: argparse.Namespace) -> int:
    """Print both decisions and the gap as JSON."""
    out = solve_posted_step(
        args.state,
        model_uri=args.model_uri,
        candidates=args.candidates,
        time_limit_s=args.time_limit,
    )
    print(json.dumps(out, indent=2, default=jsonable))
    return 0

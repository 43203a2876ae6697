"""``balanceroute cost fit``: fit the iteration cost model to a real group's step logs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from balanceroute.cli.options import positive_int
from balanceroute.router.lab.cost import DEFAULT_PREFILL_CHUNK, write_cost_file
from balanceroute.router.lab.cost_fit import fit_cost
from balanceroute.serving.testbed.realgroup.steplog import read_steps


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``cost fit`` to the root parser's subcommands."""
    cost = sub.add_parser("cost", help="fit the iteration cost model to an engine's steps")
    commands = cost.add_subparsers(dest="cost_command", metavar="SUBCOMMAND")
    commands.required = True
    fit = commands.add_parser(
        "fit",
        help="fit t_fixed, t_token and t_prefill to a real group's step logs",
        description="Fit t_fixed + max_g (t_token * L_g + t_prefill * P_g) by non-negative least "
        "squares to the group step durations in DIR's step logs (steps-dp*-*.csv, written by the "
        "balanceroute-vllm plugin), write the cost file that emulate, simulate, ab and bench "
        "take as --cost FILE, and print it as JSON (with R^2, median relative error, steps).",
    )
    fit.add_argument("--steps", required=True, help="folder of the engine's step logs")
    fit.add_argument("--out", required=True, help="cost file to write (JSON)")
    fit.add_argument(
        "--prefill-chunk",
        type=positive_int,
        default=DEFAULT_PREFILL_CHUNK,
        help="prompt tokens a rank computes per step: the engine's max_num_batched_tokens "
        "(default %(default)s, vLLM on CPU)",
    )
    fit.set_defaults(func=cmd_fit)


def cmd_fit(args: argparse.Namespace) -> int:
    """Fit, write the cost file, print what it holds."""
    folder = Path(args.steps)
    fitted = fit_cost(
        read_steps(folder), prefill_chunk_tokens=args.prefill_chunk, source=str(folder)
    )
    path = write_cost_file(args.out, fitted.cost, fitted.as_dict())
    print(json.dumps(json.loads(path.read_text()), indent=2))
    return 0

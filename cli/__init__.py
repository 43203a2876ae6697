"""The ``balanceroute`` command: one CLI, one module per command.

Each command module (``balanceroute.cli.<command>``) parses its flags, calls one library
function and prints. Only the module of the command being run is imported, so ``balanceroute
trace inspect`` does not pay for MLflow or the web server. User errors are one line on stderr
and exit code 2 (3 for a tracking outage); nothing prints a traceback for bad input.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from balanceroute.cli.options import OneLineParser
from balanceroute.features.errors import UserError
from balanceroute.features.limits import input_limits

# command -> (module, one-line help); the module's register(sub) adds the full subparser.
COMMANDS: dict[str, tuple[str, str]] = {
    "trace": ("balanceroute.cli.trace", "generate, inspect or split request traces"),
    "simulate": (
        "balanceroute.cli.simulate",
        "replay a trace through one router on a simulated decode tier",
    ),
    "ab": ("balanceroute.cli.ab", "paired A/B replay of routers and estimators, with a report"),
    "solve-step": (
        "balanceroute.cli.solve_step",
        "solve one routing step exactly (MILP) beside the heuristic's decision",
    ),
    "train": (
        "balanceroute.cli.train",
        "train, evaluate, track and register completion estimators",
    ),
    "pipeline": (
        "balanceroute.cli.pipeline",
        "one learning cycle: completion log, candidates, judge, champion, reload",
    ),
    "evaluate": (
        "balanceroute.cli.evaluate",
        "score estimators on the time-ordered holdout",
    ),
    "serve": ("balanceroute.cli.serve", "serve predictions and routing decisions over HTTP"),
    "emulate": (
        "balanceroute.cli.emulate",
        "run a decode group behind one OpenAI-compatible port per rank",
    ),
    "bench": (
        "balanceroute.cli.bench",
        "replay a trace against OpenAI-compatible endpoints and measure it",
    ),
    "cost": ("balanceroute.cli.cost", "fit the iteration cost model to an engine's step logs"),
    "gateway": (
        "balanceroute.cli.gateway",
        "BalanceRoute live: an OpenAI-compatible gateway in front of the decode ranks",
    ),
    "real-group": (
        "balanceroute.cli.real_group",
        "A/B the routers through the gateway on a running lockstep vLLM group",
    ),
}


def _chosen(argv: Sequence[str]) -> str | None:
    """The command named on the command line, if the first word is one."""
    first = next((a for a in argv if not a.startswith("-")), None)
    return first if first in COMMANDS else None


def build_parser(argv: Sequence[str] = ()) -> argparse.ArgumentParser:
    """The root parser: the chosen command in full, the others by name and help only (every
    command in full when none is chosen, for ``--help``)."""
    parser = OneLineParser(
        prog="balanceroute",
        description="Admission and routing for synchronized LLM decode workers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    chosen = _chosen(argv)
    for name, (module, help_) in COMMANDS.items():
        if chosen is None or name == chosen:
            importlib.import_module(module).register(sub)
        else:
            sub.add_parser(name, help=help_)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        input_limits()  # a bad BALANCEROUTE_MAX_* override is an error of every command
        parser = build_parser(argv)
    except UserError as exc:
        print(f"balanceroute: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UserError as exc:
        print(f"balanceroute {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except OSError as exc:  # an unexpected file error still gets one line naming the path
        where = f" '{exc.filename}'" if exc.filename else ""
        print(
            f"balanceroute {args.command}: error: cannot access{where}: {exc.strerror or exc}",
            file=sys.stderr,
        )
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(code or 0)

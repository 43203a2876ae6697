"""The ``balanceroute`` command: one CLI, a subcommand group per package.

Each package contributes its subcommands through ``<package>/cli.py:register(subparsers)``;
this module only assembles them and turns user errors into one line and exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

COMMAND_MODULES = (
    "balanceroute.cli.trace",
    "balanceroute.cli.router_commands",
    "balanceroute.cli.train",
    "balanceroute.cli.serve",
    "balanceroute.cli.emulate",
    "balanceroute.cli.bench",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="balanceroute",
        description="Admission and routing for synchronized LLM decode workers.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    from balanceroute.features.errors import UserError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.func(args)
    except UserError as exc:
        print(f"balanceroute {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())

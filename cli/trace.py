"""``balanceroute trace``: generate a synthetic trace, or summarise a trace file."""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from balanceroute.cli.options import (
    fraction,
    key_blocks_count,
    positive_int,
    request_count,
    seed_int,
)
from balanceroute.features.errors import UserError
from balanceroute.features.loaders import AUTO, FORMATS, detect_format, load_trace
from balanceroute.features.split import time_split
from balanceroute.features.stats import trace_stats
from balanceroute.features.synthetic import PRESETS, generate
from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import DEFAULT_PRESET, DEFAULT_REQUESTS


def register(sub: argparse._SubParsersAction) -> None:
    """Add ``trace synth`` and ``trace inspect`` to the root parser's subcommands."""
    trace = sub.add_parser("trace", help="generate or inspect request traces")
    commands = trace.add_subparsers(dest="trace_command", metavar="SUBCOMMAND")
    commands.required = True

    synth = commands.add_parser("synth", help="write a seeded synthetic trace")
    synth.add_argument(
        "--preset",
        default=DEFAULT_PRESET,
        choices=list(PRESETS),
        help="workload preset (default: %(default)s)",
    )
    synth.add_argument(
        "--requests",
        type=request_count,
        default=DEFAULT_REQUESTS,
        help="number of requests (default: %(default)s)",
    )
    synth.add_argument(
        "--seed", type=seed_int, default=0, help="random seed; the same seed gives the same trace"
    )
    synth.add_argument(
        "--out", required=True, help="output file: .csv, .parquet or .jsonl (written atomically)"
    )
    synth.set_defaults(func=_synth)

    inspect = commands.add_parser("inspect", help="summarise a trace file")
    inspect.add_argument("file", help="trace file (Azure, Mooncake, BurstGPT or canonical)")
    inspect.add_argument(
        "--format",
        default=AUTO,
        choices=[AUTO, *FORMATS],
        help="trace layout (default: detected from the content)",
    )
    inspect.add_argument(
        "--key-blocks",
        type=key_blocks_count,
        default=2,
        help="Mooncake: leading hash blocks that form the prompt key (default: %(default)s)",
    )
    inspect.add_argument("--limit", type=positive_int, help="read only the first N requests")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.set_defaults(func=_inspect)

    split = commands.add_parser(
        "split",
        help="cut a trace in two by time (earlier part, later part)",
        description="Time-ordered split: the earlier share trains estimators, the later share "
        "is replayed, so no model ever sees the outputs it is tested on. The later part's "
        "arrival times restart at 0.",
    )
    split.add_argument("file", help="trace file (any supported layout)")
    split.add_argument("--at", type=fraction, default=0.5, help="earlier share (default 0.5)")
    split.add_argument("--format", default=AUTO, choices=[AUTO, *FORMATS])
    split.add_argument("--key-blocks", type=key_blocks_count, default=2)
    split.add_argument("--head", required=True, help="output file for the earlier part")
    split.add_argument("--tail", required=True, help="output file for the later part")
    split.set_defaults(func=_split)


def _with_warnings(command: str, action: Callable[[], Any]) -> Any:
    """Run ``action``, printing each warning it raises as one line on stderr."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = action()
    for warning in caught:
        print(f"balanceroute {command}: warning: {warning.message}", file=sys.stderr)
    return result


def _synth(args: argparse.Namespace) -> int:
    """Generate a preset and write it."""
    frame = generate(args.preset, args.requests, seed=args.seed)
    path = write_trace(frame, args.out)
    print(f"wrote {len(frame)} requests (preset {args.preset}, seed {args.seed}) to {path}")
    return 0


def check_outputs(source: str, outputs: dict[str, str]) -> None:
    """Refuse outputs that would overwrite the input, or each other."""
    src = Path(source).resolve()
    seen: dict[Path, str] = {}
    for flag, path in outputs.items():
        target = Path(path).resolve()
        if target == src:
            raise UserError(f"{flag} '{path}' is the input file: it would be overwritten")
        if target in seen:
            raise UserError(f"{flag} and {seen[target]} name the same file '{path}'")
        seen[target] = flag


def _split(args: argparse.Namespace) -> int:
    """Write the earlier and later parts of a trace to two files."""
    trace = _with_warnings(
        "trace split", lambda: load_trace(args.file, format=args.format, key_blocks=args.key_blocks)
    )
    check_outputs(args.file, {"--head": args.head, "--tail": args.tail})
    head, tail = time_split(trace, args.at, rebase_tail=True)
    write_trace(head, args.head)
    write_trace(tail, args.tail)
    print(
        f"wrote {len(head):,} earlier requests to {args.head} and {len(tail):,} later ones "
        f"to {args.tail}"
    )
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """Load a trace and print its summary."""

    def load() -> tuple[str, Any]:
        name = detect_format(args.file) if args.format == AUTO else args.format
        trace = load_trace(args.file, format=name, key_blocks=args.key_blocks, limit=args.limit)
        return name, trace

    name, trace = _with_warnings("trace inspect", load)
    summary = {"file": args.file, "format": name, **trace_stats(trace)}
    print(json.dumps(summary, indent=2) if args.json else render(summary))
    return 0


def _lengths(label: str, stats: dict[str, float]) -> str:
    """One aligned line of length statistics."""
    return (
        f"{label:<15}mean {stats['mean']:>9,.1f}  median {stats['median']:>9,.0f}  "
        f"p99 {stats['p99']:>9,.0f}  max {stats['max']:>9,.0f}"
    )


def render(summary: dict[str, Any]) -> str:
    """The human-readable summary printed by ``trace inspect``."""
    arrivals = summary["arrivals"]
    rate = arrivals["mean_rate_rps"]
    lines = [
        f"{summary['file']} ({summary['format']}): {summary['rows']:,} requests",
        _lengths("prompt tokens", summary["prompt_tokens"]),
        _lengths("output tokens", summary["output_tokens"]),
        f"{'arrivals':<15}span {arrivals['span_s']:,.1f} s, mean rate "
        + ("n/a" if rate is None else f"{rate:,.3f} req/s"),
    ]
    keys = summary["keys"]
    if keys is None:
        lines.append(f"{'prompt keys':<15}none")
    else:
        within = keys["within_key_output_std"]
        lines.append(
            f"{'prompt keys':<15}{keys['distinct']:,} distinct, "
            f"{keys['recurring_share']:.1%} of requests share their key; output std within a "
            f"key {'n/a' if within is None else f'{within:,.1f}'} vs {keys['output_std']:,.1f}"
            " overall"
        )
    return "\n".join(lines)

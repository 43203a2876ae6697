"""Command-line options shared by several commands, generated from the configuration dataclasses.

A dataclass field with ``metadata["help"]`` becomes a flag (``--field-name``) whose type follows
the field's annotation; ``None``-able fields also accept ``none``. So the workload options, the
BalanceRoute knobs and the decode tier are declared once, in the library, and every command that
takes them parses them the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
import types
from collections.abc import Callable, Iterable
from typing import Any, NoReturn, Union, get_args, get_origin, get_type_hints

from balanceroute.features.constants import MAX_HORIZON, MAX_SLOTS, MAX_WORKERS
from balanceroute.features.loaders import AUTO, FORMATS
from balanceroute.features.synthetic import PRESETS
from balanceroute.features.workload import WorkloadSpec
from balanceroute.router.lab.cost import COST_PRESETS, CostModel, resolve_cost
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.policies.balance_config import BalanceRouteConfig

MAX_INT = 2**31 - 1
DEFAULT_TRAIN_FRACTION = 0.3  # earlier share of a trace that trains on-the-fly estimators


def bounded_int(low: int, high: int) -> Callable[[str], int]:
    """argparse type: a whole number in ``[low, high]``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be at least {low:,}, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:,}, got {text}")
        return value

    parse.__name__ = "int"  # argparse names the type in its messages
    return parse


positive_int = bounded_int(1, MAX_INT)
positive_int.__doc__ = "argparse type: an integer in 1..2**31 - 1."
workers_count = bounded_int(1, MAX_WORKERS)
slots_count = bounded_int(1, MAX_SLOTS)
horizon_count = bounded_int(1, MAX_HORIZON)
seed_int = bounded_int(0, 2**32 - 1)
request_count = bounded_int(1, 10_000_000)
key_blocks_count = bounded_int(1, 1024)


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def bounded_float(low: float, high: float) -> Callable[[str], float]:
    """argparse type: a finite number in ``(low, high]``."""

    def parse(text: str) -> float:
        value = _scalar(float)(text)
        if not low < value <= high:
            raise argparse.ArgumentTypeError(f"must be > {low:g} and <= {high:g}, got {text}")
        return value

    parse.__name__ = "float"
    return parse


def fraction(text: str) -> float:
    """argparse type: a number strictly between 0 and 1."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be between 0 and 1, got {text}")
    return value


def _scalar(kind: type) -> Callable[[str], Any]:
    """argparse type of a scalar field (numbers must be finite, whole numbers fit 32 bits; the
    configuration's own checks bound the rest)."""
    if kind is int:
        return bounded_int(-MAX_INT, MAX_INT)

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        return value

    return parse


def non_negative_float(text: str) -> float:
    """argparse type: a finite number >= 0."""
    value = _scalar(float)(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


class OneLineParser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr and exit code 2 (no usage
    block: ``--help`` shows it)."""

    def error(self, message: str) -> NoReturn:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _nullable(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A parser that also takes ``none`` (returned as the marker ``NONE``)."""

    def wrapped(text: str) -> Any:
        return NONE if text.strip().lower() == "none" else parse(text)

    return wrapped


NONE = object()


def _field_kind(hint: Any) -> tuple[type, bool]:
    """The scalar type of a field and whether it may be None."""
    if get_origin(hint) in (Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        return args[0], True
    return hint, False


def add_dataclass_args(
    group: argparse._ActionsContainer, cls: type, *, dest_prefix: str, skip: Iterable[str] = ()
) -> None:
    """One flag per documented field of ``cls``, defaulting to "not given"."""
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        flag = "--" + f.name.replace("_", "-")
        dest = dest_prefix + f.name
        kind, nullable = _field_kind(hints[f.name])
        if kind is bool:
            group.add_argument(
                flag,
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f.metadata["help"],
            )
            continue
        parse = _scalar(kind)
        group.add_argument(
            flag,
            dest=dest,
            type=_nullable(parse) if nullable else parse,
            default=None,
            metavar=kind.__name__.upper(),
            help=f.metadata["help"] + (" ('none' to disable)" if nullable else ""),
        )


def given_fields(args: argparse.Namespace, cls: type, *, dest_prefix: str) -> dict[str, Any]:
    """The fields of ``cls`` set on the command line (``none`` as None)."""
    out = {}
    for f in dataclasses.fields(cls):
        value = getattr(args, dest_prefix + f.name, None)
        if value is not None:
            out[f.name] = None if value is NONE else value
    return out


class DeprecatedAlias(argparse.Action):
    """An old flag name that still works for one release, with a warning naming the new one."""

    def __init__(self, option_strings: list[str], dest: str, *, new: str, **kwargs: Any) -> None:
        self.new = new
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        print(
            f"{parser.prog}: warning: {option_string} is deprecated and will be removed in the "
            f"next release; use {self.new}",
            file=sys.stderr,
        )
        setattr(namespace, self.dest, values)


def add_alias(
    parser: argparse._ActionsContainer, old: str, new: str, dest: str, **kwargs: Any
) -> None:
    """Accept ``old`` as a deprecated spelling of ``new`` (same destination)."""
    parser.add_argument(
        old, dest=dest, action=DeprecatedAlias, new=new, help=argparse.SUPPRESS, **kwargs
    )


# ---- the groups ---------------------------------------------------------------------------------


def add_workload_args(parser: argparse.ArgumentParser) -> None:
    """``--trace FILE | --preset NAME`` and friends (:class:`WorkloadSpec`)."""
    help_of = {f.name: f.metadata["help"] for f in dataclasses.fields(WorkloadSpec)}
    g = parser.add_argument_group("workload")
    src = g.add_mutually_exclusive_group()
    src.add_argument("--trace", help=help_of["trace"])
    src.add_argument("--preset", choices=list(PRESETS), help=help_of["preset"])
    g.add_argument("--requests", type=request_count, help=help_of["requests"])
    g.add_argument("--seed", type=seed_int, default=0, help=help_of["seed"])
    g.add_argument("--format", default=AUTO, choices=[AUTO, *FORMATS], help=help_of["format"])
    g.add_argument("--key-blocks", type=key_blocks_count, default=2, help=help_of["key_blocks"])


def workload_from_args(args: argparse.Namespace) -> WorkloadSpec:
    """The workload the flags name."""
    return WorkloadSpec(
        trace=args.trace,
        preset=args.preset,
        requests=args.requests,
        seed=args.seed,
        format=args.format,
        key_blocks=args.key_blocks,
    )


def add_tier_args(parser: argparse.ArgumentParser) -> None:
    """Decode tier, prefill tier, arrival scaling and cost model."""
    g = parser.add_argument_group("decode tier")
    g.add_argument(
        "--slots", type=slots_count, default=64, help="B: slots per worker (max_num_seqs)"
    )
    load = g.add_mutually_exclusive_group()
    load.add_argument(
        "--rate-scale", type=bounded_float(0, 1e6), default=1.0, help="arrivals X times faster"
    )
    load.add_argument(
        "--load",
        type=bounded_float(0, 1e3),
        help="arrivals at X times the estimated decode capacity",
    )
    load.add_argument("--saturate", action="store_true", help="release everything at t=0")
    add_cost_arg(g)
    g.add_argument(
        "--t-fixed", type=non_negative_float, help="override the preset's fixed step time (s)"
    )
    g.add_argument(
        "--t-token", type=non_negative_float, help="override the preset's time per KV token (s)"
    )
    g.add_argument(
        "--prefill-instances",
        type=prefill_instances,
        default=4,
        help="prefill instances P, or 'auto': as many as the arrivals need (see the summary's "
        "achieved_decode_load)",
    )


def prefill_instances(text: str) -> int:
    """argparse type: a number of prefill instances, or ``auto`` (0)."""
    return 0 if text.strip().lower() == "auto" else bounded_int(1, 4096)(text)


COST_HELP = (
    "iteration cost model: a preset (" + ", ".join(sorted(COST_PRESETS)) + ") or a cost file "
    "(JSON, written by balanceroute cost fit); default %(default)s"
)


def add_cost_arg(parser: argparse.ArgumentParser | Any, help_: str = COST_HELP) -> None:
    """``--cost NAME|FILE`` (resolved by :func:`resolve_cost` when the command runs)."""
    parser.add_argument("--cost", default="paper-dsv3", metavar="NAME|FILE", help=help_)


def cost_from_args(args: argparse.Namespace) -> CostModel:
    """The cost model: the preset or cost file with any overrides."""
    base = resolve_cost(args.cost)
    return dataclasses.replace(
        base,
        t_fixed_s=base.t_fixed_s if args.t_fixed is None else args.t_fixed,
        t_token_s=base.t_token_s if args.t_token is None else args.t_token,
    )


def prefill_from_args(args: argparse.Namespace) -> PrefillConfig:
    """The prefill tier and arrival scaling (``--load`` is resolved per replay)."""
    return PrefillConfig(
        instances=args.prefill_instances,
        rate_scale=args.rate_scale if args.load is None else 1.0,
        saturate=args.saturate,
    )


ROUTER_DEST = "br_"


def add_router_option_args(parser: argparse.ArgumentParser) -> None:
    """One flag per BalanceRoute knob (:class:`BalanceRouteConfig`)."""
    group = parser.add_argument_group("BalanceRoute options (br0, brh, brh-paper)")
    add_dataclass_args(group, BalanceRouteConfig, dest_prefix=ROUTER_DEST)


def router_options(args: argparse.Namespace) -> dict[str, Any]:
    """The BalanceRoute options the user set explicitly (``none`` means None)."""
    return given_fields(args, BalanceRouteConfig, dest_prefix=ROUTER_DEST)

"""Command-line options shared by several commands, generated from the configuration classes.

A dataclass field with ``metadata["help"]`` becomes a flag (``--field-name``) whose type follows
the field's annotation; ``None``-able fields also accept ``none``. A settings model's fields
(pydantic, such as the gateway's) become flags the same way (:func:`settings_flags`). So the
workload options, the BalanceRoute knobs, the decode tier and the gateway's settings are declared
once, in the library, and every command that takes them parses them the same way.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
import sys
import types
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn, Union, get_args, get_origin, get_type_hints

import annotated_types
from pydantic import BaseModel
from pydantic_core import PydanticUndefined

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


@dataclass(frozen=True)
class Flag:
    """One generated flag: its name, destination, help and how its text is read."""

    flag: str
    dest: str
    help: str
    parse: Callable[[str], Any] | None = None  # None: a --flag/--no-flag pair (a bool)
    metavar: str | None = None
    choices: tuple[Any, ...] | None = None
    repeat: bool = False  # a list: the flag is given once per item


def add_flags(group: argparse._ActionsContainer, flags: Iterable[Flag]) -> None:
    """One argument per flag, defaulting to "not given" (None)."""
    for f in flags:
        if f.parse is None:
            group.add_argument(f.flag, dest=f.dest, action=argparse.BooleanOptionalAction,
                               default=None, help=f.help)  # fmt: skip
            continue
        group.add_argument(f.flag, dest=f.dest, type=f.parse, default=None, metavar=f.metavar,
                           choices=f.choices, help=f.help,
                           action="append" if f.repeat else "store")  # fmt: skip


def dataclass_flags(cls: type, *, dest_prefix: str, skip: Iterable[str] = ()) -> list[Flag]:
    """The flags of the documented fields of a dataclass (``metadata["help"]``); ``None``-able
    fields also accept ``none``."""
    hints = get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if f.name in skip or "help" not in f.metadata:
            continue
        kind, nullable = _field_kind(hints[f.name])
        flag = "--" + f.name.replace("_", "-")
        if kind is bool:
            out.append(Flag(flag, dest_prefix + f.name, f.metadata["help"]))
            continue
        parse = _nullable(_scalar(kind)) if nullable else _scalar(kind)
        out.append(Flag(flag, dest_prefix + f.name,
                        f.metadata["help"] + (" ('none' to disable)" if nullable else ""),
                        parse, kind.__name__.upper()))  # fmt: skip
    return out


def add_dataclass_args(
    group: argparse._ActionsContainer, cls: type, *, dest_prefix: str, skip: Iterable[str] = ()
) -> None:
    """One flag per documented field of ``cls``, defaulting to "not given"."""
    add_flags(group, dataclass_flags(cls, dest_prefix=dest_prefix, skip=skip))


def settings_flags(cls: type[BaseModel]) -> list[Flag]:
    """The flags of a settings model, one per field, its ``description`` the help (with the
    default). A field ``name_s`` in seconds is ``--name`` and takes a duration; a list repeats
    its flag; a Literal offers its values; the field's bounds are checked as the flag is read.
    ``json_schema_extra={"flag": ...}`` names another flag, ``{"flag": None}`` keeps a field
    (a secret) to its environment variable."""
    out = []
    for name, info in cls.model_fields.items():
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        seconds = name.endswith("_s")
        flag = extra.get("flag", "--" + name.removesuffix("_s" if seconds else "").replace("_", "-"))
        if flag is None:
            continue
        kind, _ = _field_kind(info.annotation)
        help = (info.description or "") + _default_note(info.default, seconds)
        if kind is bool:
            out.append(Flag(str(flag), name, help))
        elif get_origin(kind) is Literal:  # read as lower case, as the settings read it
            out.append(Flag(str(flag), name, help, _lower, choices=get_args(kind)))
        elif get_origin(kind) is list:
            out.append(Flag(str(flag), name, help, str, str(extra.get("metavar", "VALUE")), repeat=True))
        else:
            low, strict, high = _bounds(info.metadata)
            parse = duration_type(low, strict, high) if seconds else _bounded(kind, low, strict, high)
            metavar = extra.get("metavar", "DURATION" if seconds else "N" if kind is int else None)
            out.append(Flag(str(flag), name, help, parse, metavar))  # type: ignore[arg-type]
    return out


def given_settings(args: argparse.Namespace, cls: type[BaseModel]) -> dict[str, Any]:
    """The fields of settings model ``cls`` set on the command line."""
    return {k: v for k in cls.model_fields if (v := getattr(args, k, None)) is not None}


def _lower(text: str) -> str:
    """argparse type: the text in lower case."""
    return text.strip().lower()


def _default_note(default: Any, seconds: bool) -> str:
    if default is None or default is PydanticUndefined or default == "":
        return ""
    if isinstance(default, bool):
        return f" (default: {'on' if default else 'off'})"
    return f" (default: {default:g}s)" if seconds else f" (default: {default})"


def _bounds(metadata: Iterable[Any]) -> tuple[float, bool, float]:
    """A field's lower bound, whether it is strict, and its upper bound."""
    low, strict, high = -math.inf, False, math.inf
    for m in metadata:
        if isinstance(m, annotated_types.Ge):
            low, strict = float(m.ge), False
        elif isinstance(m, annotated_types.Gt):
            low, strict = float(m.gt), True
        elif isinstance(m, annotated_types.Le):
            high = float(m.le)
    return low, strict, high


def _bounded(kind: type, low: float, strict: bool, high: float) -> Callable[[str], Any]:
    """argparse type of a bounded scalar field (a string as it is)."""
    if kind is int:
        lo = -MAX_INT if low == -math.inf else int(low) + strict
        return bounded_int(lo, MAX_INT if high == math.inf else int(high))
    if kind is float:
        return bounded_float(low, high) if strict else _scalar(float)
    return _scalar(kind)


_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration_type(low: float = 0.0, strict: bool = True, high: float = math.inf) -> Callable[[str], float]:
    """argparse type: a duration such as ``30s``, ``2m``, ``500ms`` or ``45`` (seconds), longer
    than ``low`` (or as long, not ``strict``) and at most ``high``."""

    def parse(text: str) -> float:
        match = _DURATION.match(text)
        if match is None:
            raise argparse.ArgumentTypeError(f"expected a duration such as 30s or 2m, got {text!r}")
        value = float(match.group(1)) * _UNIT[match.group(2)]
        if value < low or (strict and value == low):
            raise argparse.ArgumentTypeError(f"must be longer than {max(low, 0):g}, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be at most {high:g}s, got {text}")
        return value

    parse.__name__ = "duration"
    return parse


duration = duration_type()
duration.__doc__ = "argparse type: a duration such as ``30s``, ``2m``, ``500ms`` or ``45`` (seconds), > 0."


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

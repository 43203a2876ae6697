"""The bounds on request sizes that every entry enforces: trace loaders, the HTTP API, online
updates of the estimators (``observe``) and the histograms behind them.

They are far above any real model's context and far below what hurts: an output length sizes
the survival histograms (:class:`balanceroute.features.windows.MarginalCounts`), the keyed
composite codes keep outputs in :data:`balanceroute.features.windows.OUT_BITS` bits, and the
simulator runs one iteration per output token. Defaults below; each can be overridden by an
environment variable (``BALANCEROUTE_MAX_PROMPT_TOKENS``, ``BALANCEROUTE_MAX_OUTPUT_TOKENS``,
``BALANCEROUTE_MAX_ARRIVAL_S``) within the hard ceilings of :data:`CEILINGS`, read once per
process by :func:`input_limits`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from dataclasses import dataclass, field
from typing import Any

from balanceroute.features.errors import UserError

ENV_PREFIX = "BALANCEROUTE_"


@dataclass(frozen=True, slots=True)
class InputLimits:
    """Largest accepted request sizes (the smallest is always 1 token, 0 seconds)."""

    max_prompt_tokens: int = field(
        default=2**24, metadata={"help": "prompt tokens of one request (16,777,216)"}
    )
    max_output_tokens: int = field(
        default=2**20, metadata={"help": "output tokens of one request, and age (1,048,576)"}
    )
    max_arrival_s: float = field(
        default=1e9, metadata={"help": "arrival time, seconds from the trace's start (~31 years)"}
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            value, ceiling = getattr(self, f.name), CEILINGS[f.name]
            if not (isinstance(value, int | float) and math.isfinite(value)):
                raise UserError(f"{ENV_PREFIX}{f.name.upper()}: expected a number, got {value!r}")
            if not 1 <= value <= ceiling:
                raise UserError(
                    f"{ENV_PREFIX}{f.name.upper()} must be between 1 and {ceiling:,}, got {value:,}"
                )


# Hard ceilings of the overrides: outputs (plus the largest horizon, 1,024) must fit the keyed
# composite's 21 bits, prompts and loads int32 per request, arrivals a float's integer range.
CEILINGS: dict[str, int | float] = {
    "max_prompt_tokens": 2**31 - 1,
    "max_output_tokens": 2**21 - 2**11,
    "max_arrival_s": 1e12,
}


def _parse(name: str, kind: type, text: str) -> Any:
    """One environment override as ``kind``; a UserError naming the variable otherwise."""
    try:
        return kind(text.strip())
    except ValueError:
        noun = "a whole number" if kind is int else "a number"
        raise UserError(f"{ENV_PREFIX}{name.upper()}: expected {noun}, got {text!r}") from None


def limits_from_env(env: dict[str, str] | os._Environ[str] = os.environ) -> InputLimits:
    """The defaults with any ``BALANCEROUTE_MAX_*`` overrides of ``env``."""
    given = {}
    for f in dataclasses.fields(InputLimits):
        text = env.get(ENV_PREFIX + f.name.upper())
        if text is not None and text.strip():
            given[f.name] = _parse(f.name, type(f.default), text)
    return InputLimits(**given)


@functools.cache
def input_limits() -> InputLimits:
    """The process's limits (environment read on first use)."""
    return limits_from_env()

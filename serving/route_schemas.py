"""The ``POST /v1/route`` request: a snapshot of the group, a policy name and its options.

Apart from :mod:`balanceroute.serving.schemas` because it is built from the router itself (the
registered policy names, ``BalanceRouteConfig``'s fields): declared once, in the router.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, Field, create_model, field_validator

from balanceroute.router.balance_config import BalanceRouteConfig
from balanceroute.router.registry import policy_names
from balanceroute.serving.schemas import (
    MAX_HORIZON,
    MAX_SLOTS,
    MAX_WORKERS,
    STRICT,
    Count,
    PoolRequestIn,
    Seconds,
    Selector,
    WorkerIn,
)
from balanceroute.serving.settings import MAX_REQUESTS

PolicyName = Literal[tuple(policy_names(live=True))]  # type: ignore[valid-type]


class _Options(BaseModel):
    """Base of :data:`BalanceRouteOptions`."""

    model_config = STRICT

    def overrides(self) -> dict[str, Any]:
        """The options the caller set (an explicit null keeps its meaning, e.g. beta = G)."""
        return self.model_dump(exclude_unset=True)


# Bounds on the options whose size drives the cost of one decision (arrays of H + refresh
# columns, 2**r_max subsets, candidate windows), so no request can exhaust the server.
OPTION_BOUNDS: dict[str, dict[str, Any]] = {
    "horizon": {"ge": 0, "le": MAX_HORIZON},
    "refresh": {"ge": 1, "le": MAX_HORIZON},
    "r_max": {"ge": 1, "le": 8},
    "window": {"ge": 1, "le": MAX_REQUESTS},
}


def _unset_by_default(schema: dict[str, Any]) -> None:
    """An absent option means "the policy's default", not null: document no default."""
    schema.pop("default", None)


def _options_model() -> type[_Options]:
    """Every ``BalanceRouteConfig`` field as an optional override of the same type.

    Generated from the dataclass so the service follows the router's knobs as they change; the
    dataclass's own checks still run (their failures are 422s on ``options``). A field whose
    type has no None refuses an explicit null; absent fields keep the policy's defaults.
    """
    hints = get_type_hints(BalanceRouteConfig)
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(BalanceRouteConfig):
        kind = hints[f.name]
        extra = dict(OPTION_BOUNDS.get(f.name, {}))
        if float in (kind, *get_args(kind)):
            extra.setdefault("allow_inf_nan", False)
        fields[f.name] = (
            kind,
            Field(
                default=None,
                description=f.metadata.get("help"),
                json_schema_extra=_unset_by_default,
                **extra,
            ),
        )
    return create_model(
        "BalanceRouteOptions",
        __base__=_Options,
        __doc__="Overrides of ``BalanceRouteConfig`` (br0 and brh only).",
        **fields,
    )


BalanceRouteOptions = _options_model()


class RouteRequest(BaseModel):
    """``POST /v1/route``: a snapshot of the group at one admission step, and a policy."""

    model_config = STRICT

    policy: PolicyName = Field(description="a router name, as in balanceroute simulate")
    options: BalanceRouteOptions | None = None  # type: ignore[valid-type]
    model: Selector | None = Field(
        default=None, description="model for policies that look ahead (brh); default arm a"
    )
    workers: Annotated[list[WorkerIn], Field(min_length=1, max_length=MAX_WORKERS)]
    pool: Annotated[list[PoolRequestIn], Field(max_length=MAX_REQUESTS)]
    slots: Annotated[int, Field(ge=1, le=MAX_SLOTS)] | None = Field(
        default=None, description="B, slots per worker; default the most running + free"
    )
    iteration: Count = 0
    time_s: Seconds = 0.0
    seed: Count = 0

    @field_validator("pool")
    @classmethod
    def _unique_ids(cls, pool: list[PoolRequestIn]) -> list[PoolRequestIn]:
        seen: set[int | str] = set()
        for p in pool:
            if p.id in seen:
                raise ValueError(f"pool id {p.id!r} appears twice: ids name the admissions")
            seen.add(p.id)
        return pool

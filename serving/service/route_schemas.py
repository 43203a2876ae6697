"""The ``POST /v1/route`` request: a snapshot of the group, a policy name and its options.

Apart from :mod:`balanceroute.serving.service.schemas` because it is built from the router itself (the
registered policy names, ``BalanceRouteConfig``'s fields): declared once, in the router.
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model, field_validator

from balanceroute.features.constants import MAX_HORIZON, MAX_WORKERS
from balanceroute.router.policies.balance_config import BalanceRouteConfig
from balanceroute.router.policies.registry import policy_names
from balanceroute.serving.service.schemas import (
    STRICT,
    Count,
    PoolRequestIn,
    RunningRequestIn,
    Seconds,
    Selector,
    WorkerIn,
)
from balanceroute.serving.service.settings import MAX_REQUESTS, MAX_ROUTE_CELLS

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
    slots: Annotated[int, Field(ge=1, le=MAX_ROUTE_CELLS)] | None = Field(
        default=None, description="B, slots per worker; default the most running + free"
    )
    iteration: Count = 0
    time_s: Seconds = 0.0
    seed: Count = 0

    @field_validator("pool")
    @classmethod
    def _unique_ids(cls, pool: list[PoolRequestIn]) -> list[PoolRequestIn]:
        return unique_pool(pool)


def unique_pool(pool: list[PoolRequestIn]) -> list[PoolRequestIn]:
    """``pool`` if its ids are unique (they name the admissions), else a ValueError."""
    seen: set[int | str] = set()
    for p in pool:
        if p.id in seen:
            raise ValueError(f"pool id {p.id!r} appears twice: ids name the admissions")
        seen.add(p.id)
    return pool


# ---- validation in slices ------------------------------------------------------------------
# pydantic validates a whole body without releasing the GIL: a maximal snapshot (tens of
# thousands of rows) would hold every other thread, the event loop's included, for hundreds of
# milliseconds. So the routing handler validates the long lists in slices of SLICE rows (the
# interpreter may switch threads between two), then the rest with those lists empty.
SLICE = 256
_POOL = TypeAdapter(list[PoolRequestIn])
_RUNNING = TypeAdapter(list[RunningRequestIn])


class SliceErrors(ValueError):
    """Validation errors of a body validated in slices: ``{type, loc, msg}`` each."""

    def __init__(self, errors: list[dict[str, Any]]) -> None:
        super().__init__(f"{len(errors)} validation error(s)")
        self.errors = errors


def _errors(exc: ValidationError, loc: tuple[Any, ...], offset: int) -> list[dict[str, Any]]:
    out = []
    for e in exc.errors(include_url=False, include_input=False):
        where = e["loc"]
        out.append(
            {"type": e["type"], "loc": (*loc, where[0] + offset, *where[1:]), "msg": e["msg"]}
        )
    return out


def _slices(adapter: TypeAdapter, items: list[Any], loc: tuple[Any, ...]) -> list[Any]:
    """``items`` validated ``SLICE`` at a time; errors keep their full location."""
    out: list[Any] = []
    errors: list[dict[str, Any]] = []
    for start in range(0, len(items), SLICE):
        try:
            out += adapter.validate_python(items[start : start + SLICE], strict=True)
        except ValidationError as exc:
            errors += _errors(exc, loc, start)
    if errors:
        raise SliceErrors(errors)
    return out


def validate_route(data: Any) -> RouteRequest:
    """``RouteRequest.model_validate(data)`` with the pool and running lists validated in
    slices: the same result; errors as a ValidationError (the rest of the body) or
    :class:`SliceErrors` (the lists)."""
    workers = data.get("workers") if type(data) is dict else None
    pool = data.get("pool") if type(data) is dict else None
    if not (
        type(pool) is list
        and type(workers) is list
        and all(type(w) is dict and type(w.get("running", [])) is list for w in workers)
    ):
        return RouteRequest.model_validate(data)
    shell = {**data, "pool": [], "workers": [{**w, "running": []} for w in workers]}
    req = RouteRequest.model_validate(shell)
    pool_in = _slices(_POOL, pool, ("pool",))
    running = [
        _slices(_RUNNING, w.get("running", []), ("workers", g, "running"))
        for g, w in enumerate(workers)
    ]
    try:
        unique_pool(pool_in)
    except ValueError as exc:
        raise SliceErrors([{"type": "value_error", "loc": ("pool",), "msg": str(exc)}]) from None
    req.pool = pool_in
    for w, rows in zip(req.workers, running, strict=True):
        w.running = rows
    return req

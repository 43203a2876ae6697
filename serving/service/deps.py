"""Dependencies of the route handlers, as ``Annotated`` aliases (the bearer-token check lives in
:mod:`balanceroute.serving.http.auth`, shared with the gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError

from balanceroute.serving.http.auth import Authorized, require_token
from balanceroute.serving.service.metrics import ServiceMetrics
from balanceroute.serving.service.models import LoadedModel, ModelSlots, NotReady, UnknownModel
from balanceroute.serving.service.settings import ServeSettings
from balanceroute.serving.service.twin_cache import RouteTwins

__all__ = ["Authorized", "require_token"]  # re-exported for the route modules


async def get_store(request: Request) -> ModelSlots:
    """The app's model store (async: sync dependencies would each cost a thread-pool hop)."""
    return request.app.state.store


async def get_metrics(request: Request) -> ServiceMetrics:
    """The app's Prometheus collectors."""
    return request.app.state.metrics


@dataclass(frozen=True, slots=True)
class Services:
    """What the hot handlers need, read off the app in one step: each FastAPI dependency costs
    a resolution per call (tens of microseconds against a sub-millisecond budget)."""

    store: ModelSlots
    settings: ServeSettings
    metrics: ServiceMetrics
    twins: RouteTwins


def services(request: Request) -> Services:
    """The app's store, settings, metrics and the live twins of ``/v1/route``."""
    state = request.app.state
    return Services(state.store, state.settings, state.metrics, state.twins)


StoreDep = Annotated[ModelSlots, Depends(get_store)]
MetricsDep = Annotated[ServiceMetrics, Depends(get_metrics)]


def field_error(loc: tuple[str | int, ...], kind: str, msg: str) -> RequestValidationError:
    """A 422 about one field of the body."""
    return RequestValidationError([{"type": kind, "loc": loc, "msg": msg}])


def select_model(store: ModelSlots, selector: str | None) -> LoadedModel:
    """The model a request selects: 422 if no loaded model answers to it, 503 if not loaded."""
    try:
        return store.select(selector)
    except UnknownModel as exc:
        raise field_error(("body", "model"), "unknown_model", str(exc)) from None
    except NotReady as exc:
        raise HTTPException(
            status_code=503, detail=str(exc), headers={"Retry-After": "1"}
        ) from None

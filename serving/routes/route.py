"""``POST /v1/route``: one admission-and-routing decision on a posted snapshot.

The router's kernels are compiled (or loaded from numba's cache) at startup when
``warm_router`` is on (the default), else by the first call.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, HTTPException, Request

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.balance_route import BalanceRoutePolicy
from balanceroute.router.guard import ProjectionGuard
from balanceroute.serving.body import json_body, openapi_body
from balanceroute.serving.decode import check_count, validate
from balanceroute.serving.deps import Authorized, field_error, services
from balanceroute.serving.guards import RouteGuards
from balanceroute.serving.models import LoadedModel, ModelStore, NotReady, UnknownModel
from balanceroute.serving.route_schemas import RouteRequest
from balanceroute.serving.schemas import RouteResponse
from balanceroute.serving.snapshot import (
    DecisionError,
    InvalidOptions,
    decide,
    lookahead,
    prediction_free,
)

router = APIRouter(prefix="/v1", tags=["route"], dependencies=[Authorized])


def _check_sizes(data: Any, limit: int) -> None:
    """413 for a pool, or running requests over all workers, beyond the per-call limit."""
    check_count(data, "pool", limit, "pool requests")
    workers = data.get("workers") if type(data) is dict else None
    if type(workers) is list:
        running = sum(
            len(w["running"]) for w in workers if type(w) is dict and type(w.get("running")) is list
        )
        if running > limit:
            raise HTTPException(
                status_code=413, detail=f"at most {limit} running requests per call, got {running}"
            )


def _model_for(
    req: RouteRequest, store: ModelStore, horizon: int
) -> tuple[LoadedModel | None, CompletionEstimator | None, str | None]:
    """(model, estimator, fallback reason): only policies that look ahead (H > 0) use one."""

    if horizon == 0:
        return None, None, None
    try:
        model = store.select(req.model)
    except UnknownModel as exc:
        raise field_error(("body", "model"), "unknown_model", str(exc)) from None
    except NotReady as exc:
        return None, prediction_free(horizon), str(exc)
    return model, model.estimator, None


def _decide(
    req: RouteRequest,
    model: LoadedModel | None,
    estimator: CompletionEstimator | None,
    horizon: int,
    guards: RouteGuards,
) -> tuple[list[dict[str, Any]], dict[str, Any], LoadedModel | None, str | None]:
    """The decision with the model; if the model fails on this snapshot, the one without it."""

    def guard(policy: BalanceRoutePolicy) -> ProjectionGuard:
        return guards.for_call(model.arm, req.policy, policy.config, req)

    try:
        return *decide(req, estimator, guard if model is not None else None), model, None
    except (InvalidOptions, DecisionError):
        raise
    except Exception as exc:
        if model is None:
            raise
        reason = f"model {model.arm} failed: {type(exc).__name__}: {exc}"
        return *decide(req, prediction_free(horizon)), None, reason


@router.post(
    "/route",
    response_model=RouteResponse,
    openapi_extra=openapi_body("RouteRequest"),
    responses={413: {"description": "more pool or running requests than the per-call limit"}},
)
async def route(request: Request) -> RouteResponse:
    """Admissions ``[{id, worker}]`` in order; ``brh`` (and ``brh-paper``) project loads with the
    selected model.

    When the model cannot be used (not loaded yet, or it fails on this snapshot), they run on the
    ``none`` estimator and ``fallback`` says why: a routing call never fails for the model.
    """

    svc = services(request)
    data = await json_body(request)
    _check_sizes(data, svc.settings.max_requests)
    req = validate(RouteRequest, data)
    svc.metrics.batch_size.labels("/v1/route").observe(len(req.pool))
    horizon = lookahead(req)
    model, estimator, fallback = _model_for(req, svc.store, horizon)
    if model is not None:
        request.state.arm = model.arm
    try:
        admissions, described, model, failed = _decide(req, model, estimator, horizon, svc.guards)
    except InvalidOptions as exc:
        raise field_error(("body", "options"), "invalid_options", str(exc)) from None
    except DecisionError as exc:
        raise HTTPException(status_code=500, detail=f"policy '{req.policy}': {exc}") from None
    fallback = fallback or failed
    used = svc.guards.peek(model.arm, req.policy) if model is not None else None
    if used is not None:
        svc.metrics.guarded(model.arm, req.policy, used.stats())
    if fallback is not None:
        svc.metrics.fallbacks.labels("/v1/route", "model_unavailable").inc()
    return RouteResponse(
        admissions=admissions,
        policy=described,
        model=model.ref() if model is not None else None,
        fallback=fallback,
    )

"""``POST /v1/route``: one admission-and-routing decision on a posted snapshot.

The decision is CPU-bound (up to the bounds below it takes about a second), so it runs in a
worker thread: decoding, validation and routing alike, one call at a time (further calls wait
their turn within their deadline). The event loop keeps answering probes, predictions and
observations meanwhile. Bounds, each a 422 naming the field: workers x slots at most
``max_route_cells``, the options ``window`` and ``r_max`` at most ``max_route_window`` and
``max_route_r_max``, and the estimated work of the call (:func:`route_work`) at most
``max_route_work``. A call not decided within ``route_deadline_s`` answers 503: the caller falls
back, as on any error, and the thread finishes in the background (the next call waits for it).

The router's kernels are compiled (or loaded from numba's cache) at startup when
``warm_router`` is on (the default), else by the first call.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, HTTPException, Request

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.policies.balance_config import BRH_DEFAULTS
from balanceroute.router.policies.registry import policy_class
from balanceroute.serving.service.body import openapi_body
from balanceroute.serving.service.decode import check_count, parse_json, validate
from balanceroute.serving.service.deps import Authorized, Services, field_error, services
from balanceroute.serving.service.models import LoadedModel, ModelSlots, NotReady, UnknownModel
from balanceroute.serving.service.route_schemas import RouteRequest, validate_route
from balanceroute.serving.service.schemas import RouteResponse
from balanceroute.serving.service.settings import ServeSettings
from balanceroute.serving.service.snapshot import (
    DecisionError,
    InvalidOptions,
    decide,
    lookahead,
    prediction_free,
)
from balanceroute.serving.service.twin_cache import RouteTwins

router = APIRouter(prefix="/v1", tags=["route"], dependencies=[Authorized])


@router.get("/route/twins")
async def route_twins(request: Request) -> dict[str, Any]:
    """The live twins of ``/v1/route`` (one per arm and policy): weight, blocks judged,
    switches, CPU seconds, lag in blocks, and what their feed holds; their process's state
    (running, restarting after a death, off), pid and restarts."""
    twins = services(request).twins
    return {"twins": twins.stats(), "process": twins.worker.status()}


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


# Work units of one decision, from the router's loops: each admission scores its candidates
# (the stage-1 window, or stage 2's subsets of r_max) over the horizon plus a fixed overhead.
ROUTE_OVERHEAD_COLUMNS = 64
ROUTE_GATE = threading.Lock()  # one decision at a time: the machine has few cores


def route_work(req: RouteRequest, horizon: int) -> int:
    """Estimated work units of a decision: admissions x candidates x (horizon + overhead)."""
    opts = req.options.overrides() if req.options is not None else {}
    defaults = getattr(policy_class(req.policy), "defaults", None) or BRH_DEFAULTS
    window = opts.get("window") or defaults.window
    r_max = opts.get("r_max") or defaults.r_max
    due = min(len(req.pool), sum(w.free_slots for w in req.workers))
    candidates = min(window, len(req.pool)) + 2**r_max
    return due * candidates * (horizon + ROUTE_OVERHEAD_COLUMNS)


def check_work(req: RouteRequest, horizon: int, settings: ServeSettings) -> None:
    """422 for a snapshot beyond the per-call bounds of the settings."""
    opts = req.options.overrides() if req.options is not None else {}
    for name, most in (("window", settings.max_route_window), ("r_max", settings.max_route_r_max)):
        if (opts.get(name) or 0) > most:
            raise field_error(
                ("body", "options", name),
                "less_than_equal",
                f"{name} is at most {most} on this server, got {opts[name]}",
            )
    slots = req.slots or max(len(w.running) + w.free_slots for w in req.workers)
    cells = len(req.workers) * slots
    if cells > settings.max_route_cells:
        raise field_error(
            ("body", "workers"),
            "too_large",
            f"workers x slots is at most {settings.max_route_cells:,} on this server, got "
            f"{len(req.workers)} x {slots:,}",
        )
    work = route_work(req, horizon)
    if work > settings.max_route_work:
        raise field_error(
            ("body", "pool"),
            "too_much_work",
            f"this decision needs about {work:.2e} work units (admissions x (window + 2^r_max) "
            f"x (horizon + {ROUTE_OVERHEAD_COLUMNS})), at most {settings.max_route_work:.2e} "
            "on this server: send a smaller pool, window or horizon",
        )


def _model_for(
    req: RouteRequest, store: ModelSlots, horizon: int
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
    return model, store.shared(model), None


def _decide(
    req: RouteRequest,
    model: LoadedModel | None,
    estimator: CompletionEstimator | None,
    horizon: int,
    twins: RouteTwins,
    store: ModelSlots,
) -> tuple[list[dict[str, Any]], dict[str, Any], LoadedModel | None, str | None]:
    """The decision with the model (BR-H at its live twin's weight); if the model fails on
    this snapshot, the one without it."""

    def twin() -> float:
        return twins.for_call(model.slot, req.policy, req, estimator, store.lock)

    try:
        admissions, described = decide(req, estimator, twin if model is not None else None)
        if model is not None and "blend_used" in described:
            twins.admitted(model.slot, req.policy, [a["id"] for a in admissions], req.iteration,
                           req, estimator)  # fmt: skip
        return admissions, described, model, None
    except (InvalidOptions, DecisionError):
        raise
    except Exception as exc:
        if model is None:
            raise
        reason = f"model {model.slot} failed: {type(exc).__name__}: {exc}"
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
    raw = await request.body()
    deadline = svc.settings.route_deadline_s
    started = time.monotonic()
    try:
        with anyio.fail_after(deadline):
            response, arm = await anyio.to_thread.run_sync(
                _route_in_thread, raw, svc, started + deadline, abandon_on_cancel=True
            )
    except TimeoutError:
        svc.metrics.fallbacks.labels("/v1/route", "deadline").inc()
        raise HTTPException(
            status_code=503,
            detail=f"no routing decision within the deadline of {deadline:g} s: fall back",
            headers={"Retry-After": "1"},
        ) from None
    if arm is not None:
        request.state.arm = arm
    return response


def _route_in_thread(
    raw: bytes, svc: Services, deadline: float
) -> tuple[RouteResponse, str | None]:
    """Decode, check and decide (in a worker thread, one call at a time)."""
    if not ROUTE_GATE.acquire(timeout=max(0.0, deadline - time.monotonic())):
        raise TimeoutError
    try:
        return _route(parse_json(raw), svc)
    finally:
        ROUTE_GATE.release()


def _route(data: Any, svc: Services) -> tuple[RouteResponse, str | None]:
    """The decision on a decoded body and the arm whose model it used."""
    _check_sizes(data, svc.settings.max_requests)
    req = validate(RouteRequest, data, validate_route)
    svc.metrics.batch_size.labels("/v1/route").observe(len(req.pool))
    horizon = lookahead(req)
    check_work(req, horizon, svc.settings)
    model, estimator, fallback = _model_for(req, svc.store, horizon)
    arm = model.slot if model is not None else None
    try:
        admissions, described, model, failed = _decide(
            req, model, estimator, horizon, svc.twins, svc.store
        )
    except InvalidOptions as exc:
        raise field_error(("body", "options"), "invalid_options", str(exc)) from None
    except DecisionError as exc:
        raise HTTPException(status_code=500, detail=f"policy '{req.policy}': {exc}") from None
    fallback = fallback or failed
    if fallback is not None:
        svc.metrics.fallbacks.labels("/v1/route", "model_unavailable").inc()
    response = RouteResponse(
        admissions=admissions,
        policy=described,
        model=model.ref() if model is not None else None,
        fallback=fallback,
    )
    return response, arm

"""Probes, open to all: ``/healthz`` (the process is up) and ``/readyz`` (every arm is loaded
and healthy)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from balanceroute.serving.service.deps import StoreDep
from balanceroute.serving.service.schemas import StatusResponse

router = APIRouter(tags=["probes"])


@router.get("/healthz", response_model=StatusResponse)
async def healthz() -> StatusResponse:
    """The process answers."""
    return StatusResponse(status="ok")


@router.get(
    "/readyz",
    response_model=StatusResponse,
    responses={503: {"model": StatusResponse, "description": "a model is not loaded yet"}},
)
async def readyz(store: StoreDep) -> StatusResponse | JSONResponse:
    """200 once every configured arm has a model that passes its health check; 503 before, after
    a failed load (with the next retry) or once a model fails its health check."""
    broken = store.check_health()
    if store.ready:
        return StatusResponse(status="ready")
    missing = [store.not_ready_reason(arm) for arm in store.uris if arm not in store.slots]
    failed = any(arm in store.errors for arm in store.uris if arm not in store.slots)
    status = "unhealthy" if broken else ("failed" if failed else "loading")
    unhealthy = [store.not_ready_reason(arm) for arm in broken]
    body = StatusResponse(status=status, detail="; ".join(missing + unhealthy))
    return JSONResponse(body.model_dump(), status_code=503)

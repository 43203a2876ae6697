"""Probes, open to all: ``/healthz`` (the process is up), ``/readyz`` (a rank is in rotation; why
each rank is out only to a caller with the bearer token, when one is configured) and ``/health``
(vLLM's probe, the one a front router such as ``sglang-router`` or ``vllm-router`` polls before
it sends a group any request: ``/readyz``'s status)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from balanceroute.serving.http.auth import authorized

router = APIRouter(tags=["probes"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    """The process answers."""
    return {"status": "ok"}


@router.get("/health")
async def health(request: Request) -> JSONResponse:
    """200 while at least one rank is in rotation, else 503: a front router takes the group out."""
    ok = bool(request.app.state.gateway.group.healthy.any())
    return JSONResponse({"status": "ready" if ok else "unavailable"}, 200 if ok else 503)


@router.get("/readyz")
async def readyz(request: Request) -> JSONResponse:
    """200 while at least one rank is in rotation; 503 (naming the ranks out) otherwise."""
    gw = request.app.state.gateway
    healthy = gw.group.healthy
    if not authorized(request):  # a bare status: rank addresses and errors stay private
        ok = bool(healthy.any())
        return JSONResponse({"status": "ready" if ok else "unavailable"}, 200 if ok else 503)
    out = [f"rank {g}: {gw.health.last_error.get(g, 'unhealthy')}" for g in range(len(healthy))
           if not healthy[g]]  # fmt: skip
    if healthy.any():
        return JSONResponse({"status": "ready", "detail": "; ".join(out) or None})
    return JSONResponse({"status": "unavailable", "detail": "; ".join(out)}, status_code=503)

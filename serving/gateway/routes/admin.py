"""Operator endpoints (bearer token): model reload, the switchback's figures, and ``GET /metrics``
(the gateway's Prometheus text, like ``serve``'s)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException, Request, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from balanceroute.features.errors import UserError
from balanceroute.serving.gateway.reload import RELOAD_FAILED, result_row
from balanceroute.serving.http.auth import Authorized

router = APIRouter(tags=["admin"], dependencies=[Authorized])


@router.post("/admin/reload")
async def reload(request: Request) -> JSONResponse:
    """Re-resolve every arm's model URI and swap what loads, passes its health check and learns
    the recent completions, between two decisions (no request is dropped); a failed load keeps
    the old model and the answer is :data:`RELOAD_FAILED`."""
    outcomes = await request.app.state.gateway.reload()
    failed = any(o.error for o in outcomes)
    body = {"results": [result_row(o) for o in outcomes]}
    return JSONResponse(body, status_code=RELOAD_FAILED if failed else 200)


@router.get("/v1/ab")
async def ab(request: Request) -> dict:
    """Per-arm figures and the paired intervals so far (finished windows)."""
    return request.app.state.gateway.ab_summary()


@router.post("/admin/ab")
async def save_ab(request: Request) -> dict:
    """Write ``OUT/ab/summary.json`` and ``report.md`` now (and log them to MLflow)."""
    try:
        return await request.app.state.gateway.save_ab()
    except UserError as exc:
        raise HTTPException(status_code=409, detail=str(exc)) from None


@router.get("/metrics")
async def metrics(request: Request) -> Response:
    """Per rank running requests, KV load and health; imbalance, pool, waits, TTFT, TPOT,
    decisions and router step time, fallbacks, re-routes, the live twins; labelled by arm."""
    gw = request.app.state.gateway
    gw.dispatcher.sample()
    twins = gw.twins
    process = twins.worker.status() if twins.enabled else None
    gw.metrics.twins(twins.stats(), twins.worker.cpu_s, twins.comparison(), process)
    return Response(generate_latest(gw.metrics.registry), media_type=CONTENT_TYPE_LATEST)

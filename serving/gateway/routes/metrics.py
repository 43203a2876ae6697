"""``GET /metrics``: the gateway's Prometheus text (behind the bearer token, like ``serve``)."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from balanceroute.serving.http.auth import Authorized

router = APIRouter(tags=["metrics"], dependencies=[Authorized])


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

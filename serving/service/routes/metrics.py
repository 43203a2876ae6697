"""``GET /metrics``: the Prometheus exposition of the service's own registry."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from balanceroute.serving.service.deps import Authorized, MetricsDep

router = APIRouter(tags=["metrics"], dependencies=[Authorized])


@router.get("/metrics", response_class=Response, responses={200: {"content": {"text/plain": {}}}})
async def prometheus(request: Request, metrics: MetricsDep) -> Response:
    """Latency and counts per endpoint and arm, batch sizes, fallbacks, model versions, and
    the live twins of ``/v1/route``."""
    metrics.twins(request.app.state.twins.stats())
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

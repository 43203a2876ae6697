"""``POST /v1/observe``: completed requests, for the online updates of every loaded model."""

from __future__ import annotations

from fastapi import APIRouter, Request

from balanceroute.serving.service.body import json_body, openapi_body
from balanceroute.serving.service.decode import decode_observe
from balanceroute.serving.service.deps import Authorized, services
from balanceroute.serving.service.schemas import ObserveRequest, ObserveResponse

router = APIRouter(prefix="/v1", tags=["observe"], dependencies=[Authorized])


@router.post(
    "/observe",
    response_model=ObserveResponse,
    openapi_extra=openapi_body(ObserveRequest),
    responses={413: {"description": "more completions than the per-call limit"}},
)
async def observe(request: Request) -> ObserveResponse:
    """Feed completions (in finish order) to every arm; kept in a bounded log for reloads.

    A large batch updates a copy of each model off the event loop: predictions and probes go on
    meanwhile; the response is sent once the updated models serve."""
    svc = services(request)
    cols = decode_observe(await json_body(request), svc.settings.max_requests)
    arms = await svc.store.observe(cols)
    request.state.arm = "all"
    svc.metrics.batch_size.labels("/v1/observe").observe(cols.size)
    svc.metrics.observed.inc(cols.size)
    return ObserveResponse(observed=cols.size, arms=arms)

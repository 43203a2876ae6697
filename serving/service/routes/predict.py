"""``POST /v1/predict``: batched completion predictions for running requests."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response

from balanceroute.serving.service import inference
from balanceroute.serving.service.body import json_body, openapi_body
from balanceroute.serving.service.decode import decode_predict
from balanceroute.serving.service.deps import Authorized, field_error, select_model, services
from balanceroute.serving.service.schemas import PredictRequest, PredictResponse

router = APIRouter(prefix="/v1", tags=["predict"], dependencies=[Authorized])


@router.post(
    "/predict",
    response_model=PredictResponse,
    openapi_extra=openapi_body(PredictRequest),
    responses={
        413: {"description": "more requests than the per-call limit"},
        503: {"description": "the selected model is not loaded yet"},
    },
)
async def predict(request: Request) -> Response:
    """``p_finish = P(r <= H)``, ``c = E[min(r, H)]`` and optionally ``P(r > h)``, h = 0..H."""
    svc = services(request)
    inp = decode_predict(await json_body(request), svc.settings.max_requests)
    model = select_model(svc.store, inp.model)
    request.state.arm = model.slot
    svc.metrics.batch_size.labels("/v1/predict").observe(inp.running.size)
    try:
        with svc.store.lock:
            pred, horizon = inference.predict(model, inp)
    except inference.HorizonUnavailable as exc:
        raise field_error(("body", "horizon"), "horizon_unavailable", str(exc)) from None
    return Response(inference.encode(model, inp, pred, horizon), media_type="application/json")

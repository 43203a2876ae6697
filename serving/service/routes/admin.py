"""``POST /v1/admin/reload``: re-resolve the configured URIs and swap changed versions in."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from balanceroute.serving.service.body import openapi_body
from balanceroute.serving.service.decode import parse_json, validate
from balanceroute.serving.service.deps import Authorized, StoreDep
from balanceroute.serving.service.schemas import ReloadRequest, ReloadResponse

RELOAD_FAILED = 502  # the model source gave nothing servable; the old model keeps serving

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Authorized])


@router.post(
    "/reload",
    response_model=ReloadResponse,
    openapi_extra=openapi_body(ReloadRequest, required=False),
    responses={RELOAD_FAILED: {"model": ReloadResponse, "description": "a model failed to load"}},
)
async def reload(request: Request, store: StoreDep) -> ReloadResponse | JSONResponse:
    """Aliases are looked up again; a new version is loaded fully, then swapped in atomically.
    A reload that failed for any model answers :data:`RELOAD_FAILED` with the same body."""
    raw = await request.body()
    req = validate(ReloadRequest, parse_json(raw)) if raw.strip() else ReloadRequest()
    answer = ReloadResponse(arms=await store.reload(req.target, force=req.force))
    if any(o.error for o in answer.arms):
        return JSONResponse(answer.model_dump(), status_code=RELOAD_FAILED)
    return answer

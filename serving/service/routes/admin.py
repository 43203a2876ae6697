"""``POST /v1/admin/reload``: re-resolve the configured URIs and swap changed versions in."""

from __future__ import annotations

from fastapi import APIRouter, Request

from balanceroute.serving.service.body import openapi_body
from balanceroute.serving.service.decode import parse_json, validate
from balanceroute.serving.service.deps import Authorized, StoreDep
from balanceroute.serving.service.schemas import ReloadRequest, ReloadResponse

router = APIRouter(prefix="/v1/admin", tags=["admin"], dependencies=[Authorized])


@router.post(
    "/reload",
    response_model=ReloadResponse,
    openapi_extra=openapi_body(ReloadRequest, required=False),
)
async def reload(request: Request, store: StoreDep) -> ReloadResponse:
    """Aliases are looked up again; a new version is loaded fully, then swapped in atomically."""
    raw = await request.body()
    req = validate(ReloadRequest, parse_json(raw)) if raw.strip() else ReloadRequest()
    return ReloadResponse(arms=await store.reload(req.arm, force=req.force))

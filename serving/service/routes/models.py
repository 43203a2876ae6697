"""``GET /v1/models``: the loaded versions, their aliases and training metrics."""

from __future__ import annotations

from fastapi import APIRouter

from balanceroute.serving.service.deps import Authorized, StoreDep
from balanceroute.serving.service.schemas import ModelsResponse

router = APIRouter(prefix="/v1", tags=["models"], dependencies=[Authorized])


@router.get("/models", response_model=ModelsResponse)
async def list_models(store: StoreDep) -> ModelsResponse:
    """Every loaded arm, with the selectors a request may use to pick one."""
    return ModelsResponse(
        default="a",
        arms=[m.info() for m in store.slots.values()],
        selectors=store.selectors(),
    )

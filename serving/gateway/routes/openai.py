"""``GET /v1/models``: the models the first rank in rotation lists. The completion routes are the
data plane's (:mod:`balanceroute.serving.gateway.plane.front`)."""

from __future__ import annotations

import aiohttp
from fastapi import APIRouter, Request, Response

from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.http.auth import Authorized
from balanceroute.serving.openai.responses import error_body

router = APIRouter(tags=["openai"], dependencies=[Authorized])
JSON = "application/json"


async def listed_models(gw: Gateway) -> bytes | None:
    """``/v1/models`` of the first rank in rotation that answers it (None: none does)."""
    for g in range(gw.group.ranks):
        if not gw.group.healthy[g]:
            continue
        url = gw.settings.rank_url(g) + "/v1/models"
        try:
            timeout = aiohttp.ClientTimeout(total=gw.settings.connect_timeout_s)
            async with gw.session.get(url, headers=gw.upstream_headers(g, "models"),
                                      timeout=timeout) as resp:  # fmt: skip
                content = await resp.read()
                if resp.status == 200:
                    return content
        except (aiohttp.ClientError, OSError, TimeoutError):
            continue
    return None


@router.get("/v1/models")
async def models(request: Request) -> Response:
    """The models the first rank in rotation lists (503 when none is)."""
    content = await listed_models(request.app.state.gateway)
    if content is not None:
        return Response(content, 200, media_type=JSON)
    return Response(error_body(503, "no rank in rotation answers /v1/models"), 503, media_type=JSON)

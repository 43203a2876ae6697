"""Error answers every BalanceRoute HTTP process gives the same way (``serve`` and ``gateway``)."""

from __future__ import annotations

import logging

import orjson
from fastapi import Request, Response
from fastapi.exceptions import RequestValidationError

log = logging.getLogger("balanceroute.serve")


async def validation_error(request: Request, exc: Exception) -> Response:
    """422 with each error's field path, type and message (inputs are not echoed back)."""
    assert isinstance(exc, RequestValidationError)
    detail = [
        {"loc": list(e.get("loc", ())), "msg": str(e.get("msg", "")), "type": str(e.get("type"))}
        for e in exc.errors()
    ]
    return Response(orjson.dumps({"detail": detail}), 422, media_type="application/json")


async def client_disconnect(request: Request, exc: Exception) -> Response:
    """A client that went away mid-upload: one log line, counted as status 499, no traceback."""
    log.warning(
        "%s %s: the client disconnected before its body arrived", request.method, request.url.path
    )
    return Response(status_code=499)

"""The gateway's own errors in vLLM's body ``{"error": {"message", "type", "param", "code"}}``:
a bad body's message (the front answers it 400, as vLLM does), HTTP errors of the gateway's app
(the bearer token's 401, 404, ...) and the Host/Origin/Content-Type refusals of
:class:`~balanceroute.serving.http.origin_check.OriginCheck`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from starlette.exceptions import HTTPException

from balanceroute.serving.openai.responses import error_body

JSON = "application/json"


def _param(loc: Any) -> str | None:
    """The dotted field path of a pydantic error's ``loc`` without the leading ``body``."""
    parts = [str(p) for p in (loc or ()) if p != "body"]
    return ".".join(parts) or None


def validation_message(errors: list[dict[str, Any]]) -> str:
    """One message naming each error's field and reason (inputs are not echoed back)."""
    lines = [f"{_param(e.get('loc')) or 'body'}: {e.get('msg', '')}" for e in errors]
    label = "error" if len(lines) == 1 else "errors"
    return f"{len(lines)} validation {label}: " + "; ".join(lines)


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTP error (401, 404, 413, ...) with its headers, in vLLM's body."""
    assert isinstance(exc, HTTPException)
    body = error_body(exc.status_code, str(exc.detail))
    return Response(body, exc.status_code, dict(exc.headers or {}), media_type=JSON)


def refusal(status: int, reason: str) -> bytes:
    """The body of a Host/Origin/Content-Type refusal."""
    return error_body(status, reason)


def install(app: FastAPI) -> None:
    """The gateway's error handlers on ``app``."""
    app.add_exception_handler(HTTPException, http_error)

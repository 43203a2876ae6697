"""The gateway's own errors in vLLM's body ``{"error": {"message", "type", "param", "code"}}``:
validation (400, as vLLM answers it, not FastAPI's 422 ``{"detail"}``), HTTP errors (the bearer
token's 401, 413, ...) and the Host/Origin/Content-Type refusals of
:class:`~balanceroute.serving.http.origin_check.OriginCheck`."""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI, Request, Response
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

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


async def validation_error(request: Request, exc: Exception) -> Response:
    """400 ``BadRequestError`` naming each bad field, as vLLM answers a bad body."""
    assert isinstance(exc, RequestValidationError)
    errors = list(exc.errors())
    param = _param(errors[0].get("loc")) if errors else None
    body = error_body(400, validation_message(errors), "BadRequestError", param)
    return Response(body, 400, media_type=JSON)


async def http_error(request: Request, exc: Exception) -> Response:
    """An HTTP error (401, 404, 413, ...) with its headers, in vLLM's body."""
    assert isinstance(exc, HTTPException)
    body = error_body(exc.status_code, str(exc.detail))
    return Response(body, exc.status_code, dict(exc.headers or {}), media_type=JSON)


def refusal(status: int, reason: str) -> bytes:
    """The body of a Host/Origin/Content-Type refusal."""
    return error_body(status, reason)


class BodyLimit:
    """ASGI middleware: a body above ``max_bytes`` gets vLLM's 413 body, at once when its
    ``Content-Length`` says so, else when the bytes read pass the limit (an HTTPException that
    :func:`http_error` answers)."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.message = f"the body is above {max_bytes} bytes (BALANCEROUTE_MAX_BODY_BYTES)"

    def _declared(self, scope: Scope) -> int:
        for key, value in scope["headers"]:
            if key == b"content-length":
                try:
                    return int(value)
                except ValueError:
                    return -1
        return -1

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if self._declared(scope) > self.max_bytes:
            body = error_body(413, self.message)
            headers = [
                (b"content-type", JSON.encode()),
                (b"content-length", str(len(body)).encode()),
            ]
            await send({"type": "http.response.start", "status": 413, "headers": headers})
            await send({"type": "http.response.body", "body": body})
            return
        seen = 0

        async def counted() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise HTTPException(413, self.message)
            return message

        await self.app(scope, counted, send)


def install(app: FastAPI) -> None:
    """The gateway's error handlers on ``app``."""
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(HTTPException, http_error)

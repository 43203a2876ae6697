"""Refuses calls a browser could be tricked into making, before any handler runs.

A page on any web site, open in a browser on the server's host, can send requests to
``127.0.0.1``: through DNS rebinding with a foreign ``Host`` header, or cross-origin with a
"simple" content type (``text/plain`` needs no CORS preflight). So, for every HTTP call:

- the ``Host`` header must name a loopback host or one of ``allowed_hosts`` (400 otherwise);
- an ``Origin`` header, which browsers send and other clients do not, must be the server's own
  origin or one of ``allowed_origins`` (403 otherwise);
- a POST that labels its body must label it JSON (``application/json`` or ``+json``; 415
  otherwise, or ``content_type_status``). An unlabelled body is taken as JSON: browsers label what they send (``text/plain``
  for a string, a form type for forms), and the one unlabelled case (a ``Blob`` without a type)
  carries an ``Origin`` header, refused above.
"""

from __future__ import annotations

from collections.abc import Callable
from urllib.parse import urlsplit

import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from balanceroute.serving.http.settings import ServiceSettings

CHECKED = frozenset((b"host", b"origin", b"content-type"))


def host_name(value: str) -> str:
    """The host part of a ``Host`` header or an origin's netloc, lower case, without the port."""
    value = value.strip().lower()
    if value.startswith("["):  # [::1]:8080
        return value[1 : value.find("]")] if "]" in value else value
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


def is_json(content_type: str) -> bool:
    """Whether a Content-Type header names JSON (``application/json`` or ``+json``)."""
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


def detail_body(status: int, reason: str) -> bytes:
    """A refusal's body as ``serve`` answers it: ``{"detail": reason}``."""
    return orjson.dumps({"detail": reason})


class OriginCheck:
    """ASGI middleware: Host, Origin and Content-Type checks (module docstring); ``body`` makes
    a refusal's JSON body (the gateway's is vLLM's error body)."""

    def __init__(
        self,
        app: ASGIApp,
        settings: ServiceSettings,
        body: Callable[[int, str], bytes] = detail_body,
        content_type_status: int = 415,
    ) -> None:
        self.app = app
        self.body = body
        self.content_type_status = content_type_status
        self.hosts = settings.host_allowlist()
        self.any_host = "*" in self.hosts
        self.origins = settings.origin_allowlist()

    def problem(self, scope: Scope) -> tuple[int, str] | None:
        """``(status, reason)`` when the call must be refused, else None."""
        found: dict[bytes, bytes] = {}  # the three headers read (the last of each, as a dict)
        for k, v in scope["headers"]:
            if k in CHECKED:
                found[k] = v
        host = found.get(b"host", b"").decode("latin-1")
        if not self.any_host and host_name(host) not in self.hosts:
            return 400, f"Host '{host[:100]}' is not allowed (see BALANCEROUTE_ALLOWED_HOSTS)"
        origin = found[b"origin"].decode("latin-1") if b"origin" in found else None
        if origin is not None:
            clean = origin.strip().rstrip("/").lower()
            own = urlsplit(clean).netloc == host.strip().lower()
            if not own and clean not in self.origins:
                return (
                    403,
                    f"Origin '{origin[:100]}' is not allowed (see BALANCEROUTE_ALLOWED_ORIGINS)",
                )
        kind = found.get(b"content-type")
        if scope["method"] == "POST" and kind is not None and not is_json(kind.decode("latin-1")):
            return (
                self.content_type_status,
                "the body must be JSON: send Content-Type: application/json",
            )
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refused = self.problem(scope)
            if refused is not None:
                status, reason = refused
                body = self.body(status, reason)
                await send(
                    {
                        "type": "http.response.start",
                        "status": status,
                        "headers": [
                            (b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                        ],
                    }
                )
                await send({"type": "http.response.body", "body": body})
                return
        await self.app(scope, receive, send)

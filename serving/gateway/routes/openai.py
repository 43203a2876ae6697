"""The OpenAI-compatible front: ``POST /v1/completions``, ``POST /v1/chat/completions`` (streaming
or not) and ``GET /v1/models`` (from a rank in rotation).

A request is checked (:mod:`balanceroute.serving.openai.requests`), counted (prompt tokens and key, :mod:`..tokens`) and
queued in the pool; a full pool answers 429 with ``Retry-After``, no rank in rotation a 503 with
``Retry-After`` at once (naming why each rank is out). From then on
:mod:`~balanceroute.serving.gateway.life` owns its life and
:class:`~balanceroute.serving.gateway.relay.Relay` moves its bytes.
"""

from __future__ import annotations

import math
from typing import Any

import aiohttp
import orjson
from fastapi import APIRouter, Request, Response
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from balanceroute.features.prompts import chat_text
from balanceroute.serving.gateway.life import PoolFull, arrive
from balanceroute.serving.gateway.relay import Relay
from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.gateway.tokens import prompt_key
from balanceroute.serving.http.auth import Authorized
from balanceroute.serving.openai.requests import ChatBody, CompletionBody
from balanceroute.serving.openai.responses import error_body

router = APIRouter(tags=["openai"], dependencies=[Authorized])
JSON = "application/json"


async def _body(request: Request, model: type[BaseModel]) -> tuple[dict[str, Any], Any]:
    """The posted JSON object and its checked view; a 422 naming each bad field otherwise."""
    raw = await request.body()
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body",), "msg": f"invalid JSON: {exc}"}]
        ) from None
    if not isinstance(data, dict):
        raise RequestValidationError(
            [{"type": "model_type", "loc": ("body",), "msg": "the body must be a JSON object"}]
        )
    try:
        return data, model.model_validate(data)
    except ValidationError as exc:
        errors = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
        raise RequestValidationError(errors) from None


def _queue(
    gw: Gateway, request: Request, data: dict[str, Any], prompt: Any, body: Any, chat: bool
) -> Response:
    """Count the prompt, queue the request (429 when the pool is full) and hand it to a relay."""
    if gw.drain.draining:
        body = error_body(503, "the gateway is shutting down")
        return Response(body, 503, {"retry-after": "1", "connection": "close"}, media_type=JSON)
    if not gw.group.healthy.any():  # nothing could serve it: say so now, not after a wait
        return _unavailable(gw)
    tokens, _ = gw.counter.count(prompt)
    key, key_hash = prompt_key(prompt)
    try:
        req = arrive(gw, request_id=request.headers.get("x-request-id"), path=request.url.path,
                     chat=chat, body=data, checked=body, tokens=tokens, key=key,
                     key_hash=key_hash)  # fmt: skip
    except PoolFull as full:
        return Response(error_body(429, str(full)), 429, {"retry-after": "1"}, media_type=JSON)
    return Relay(gw, req)


def _unavailable(gw: Gateway) -> Response:
    """503 with ``Retry-After`` (the next health check) naming why each rank is out."""
    why = "; ".join(f"rank {g}: {e}" for g, e in sorted(gw.health.last_error.items()))
    retry = str(max(1, math.ceil(gw.settings.health_interval_s)))
    body = error_body(503, f"no rank is in rotation ({why or 'health checks failing'})")
    return Response(body, 503, {"retry-after": retry}, media_type=JSON)


@router.post("/v1/completions")
async def completions(request: Request) -> Response:
    """OpenAI completions: one prompt (text or token ids), streaming or not."""
    data, body = await _body(request, CompletionBody)
    return _queue(request.app.state.gateway, request, data, body.single_prompt(), body, False)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request) -> Response:
    """OpenAI chat completions, streaming or not (the prompt is the messages' text)."""
    data, body = await _body(request, ChatBody)
    prompt = chat_text(data["messages"])
    return _queue(request.app.state.gateway, request, data, prompt, body, True)


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

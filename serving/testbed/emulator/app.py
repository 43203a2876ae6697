"""The OpenAI-compatible FastAPI app of one emulated rank (one per port, one shared group).

``POST /v1/completions`` and ``POST /v1/chat/completions`` (streaming as vLLM streams: one SSE
``data:`` chunk per token, the last token's chunk carries ``finish_reason``, then a ``usage``
chunk with empty ``choices`` when ``stream_options.include_usage`` is set (and the usage so far in
every chunk with ``continuous_usage_stats``, as vLLM), then
``data: [DONE]``; or one JSON body), ``GET /v1/models``, ``GET /health``, ``GET /metrics``
(vLLM's metric names), ``GET /v1/emulator/state`` (the group's counters, for tools) and what the
peer routers ask an engine for (``peer_api.py``: SGLang's ``/get_load``, ``/get_server_info``,
``/get_model_info``, vLLM's ``/v1/completions/render``).
Errors use vLLM's body ``{"error": {"message", "type", "param", "code"}}``; request
validation errors (wrong types, invalid JSON, out-of-range values) are 400s as in vLLM, and
unknown fields are logged and ignored as vLLM does. A handler never raises into the server: whatever the client does, the group keeps
every accepted request until it finishes or the client goes away.
"""

from __future__ import annotations

import asyncio
import time
from http import HTTPStatus
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from starlette.exceptions import HTTPException
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from balanceroute.features.prompts import chat_text, count_tokens
from balanceroute.serving.openai.requests import (
    ChatCompletionRequest,
    CompletionRequest,
    prompt_batch,
)
from balanceroute.serving.openai.responses import error_body, usage, whole_answer, whole_choice
from balanceroute.serving.openai.sse import DONE, SSE_HEADERS
from balanceroute.serving.testbed.emulator.group import FINISHED, DecodeGroup, EmuRequest
from balanceroute.serving.testbed.emulator.peer_api import add_peer_routes

TOKEN_TEXT = " the"
JSON_TYPE = "application/json"


class BadRequest(Exception):
    """A request the emulator refuses: status, message and OpenAI error type."""

    def __init__(self, message: str, status: int = 400, type_: str = "BadRequestError") -> None:
        super().__init__(message)
        self.status = status
        self.type = type_


def error_response(status: int, message: str, type_: str = "BadRequestError") -> Response:
    """vLLM's error body."""
    return Response(error_body(status, message, type_), status, media_type=JSON_TYPE)


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    parts = []
    for e in exc.errors()[:5]:
        if e.get("type") == "json_invalid":
            parts.append(f"invalid JSON body: {e.get('ctx', {}).get('error', 'cannot parse')}")
            continue
        loc = ".".join(str(p) for p in e.get("loc", ()) if p != "body") or "body"
        parts.append(f"{loc}: {e.get('msg', 'invalid')}")
    return error_response(400, "; ".join(parts))


async def _http_error(request: Request, exc: Exception) -> Response:
    """FastAPI's own refusals (a body that is not UTF-8 or nests too deep to parse) in vLLM's
    body: a 400 is a ``BadRequestError``."""
    assert isinstance(exc, HTTPException)
    kind = "BadRequestError" if exc.status_code == 400 else HTTPStatus(exc.status_code).phrase
    return error_response(exc.status_code, str(exc.detail), kind)


async def _bad_request(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, BadRequest)
    return error_response(exc.status, str(exc), exc.type)


class ReceivedAt:
    """ASGI middleware: stamp each HTTP request with its arrival time (before the body is
    read), so the emulator's own TTFT and E2E start where a real engine's API server starts."""

    def __init__(self, app: Any, clock: Any) -> None:
        self.app = app
        self.clock = clock

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["recv_s"] = self.clock()
        await self.app(scope, receive, send)


class Chunks:
    """Pre-encoded SSE bytes of one streaming request: the same ``mid`` chunk for every token."""

    __slots__ = ("abort", "include_usage", "last", "mid", "role", "usage_base")

    @staticmethod
    def with_usage(chunk: bytes, prompt: int, completion: int) -> bytes:
        """``chunk`` carrying the usage so far (``continuous_usage_stats``), as vLLM sends it."""
        tail = orjson.dumps(usage(prompt, completion))
        return chunk[: -len(b"}\n\n")] + b',"usage":' + tail + b"}\n\n"

    def __init__(self, chat: bool, rid: str, created: int, model: str, reason: str, usage: bool):
        base = {
            "id": rid,
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
        }

        def chunk(choice: dict[str, Any]) -> bytes:
            return b"data: " + orjson.dumps({**base, "choices": [choice]}) + b"\n\n"

        if chat:
            self.role = chunk(
                {
                    "index": 0,
                    "delta": {"role": "assistant", "content": ""},
                    "logprobs": None,
                    "finish_reason": None,
                }
            )
            tok = {"index": 0, "delta": {"content": TOKEN_TEXT}, "logprobs": None}
        else:
            self.role = b""
            tok = {"index": 0, "text": TOKEN_TEXT, "logprobs": None}
        self.mid = chunk({**tok, "finish_reason": None} | ({} if chat else {"stop_reason": None}))
        self.last = chunk(
            {**tok, "finish_reason": reason} | ({} if chat else {"stop_reason": None})
        )
        # a request aborted by a shutdown ends as vLLM ends it: finish_reason "abort", no token
        self.abort = chunk({"index": 0, "delta": {}, "logprobs": None, "finish_reason": "abort"}
                           if chat else {"index": 0, "text": "", "logprobs": None,
                                         "finish_reason": "abort", "stop_reason": None})  # fmt: skip
        self.usage_base = base
        self.include_usage = usage

    def usage(self, prompt: int, completion: int) -> bytes:
        """The usage chunk (empty ``choices``)."""
        body = {**self.usage_base, "choices": [], "usage": usage(prompt, completion)}
        return b"data: " + orjson.dumps(body) + b"\n\n"


async def _watch_disconnect(receive: Receive, group: DecodeGroup, req: EmuRequest) -> None:
    """Cancel ``req`` when the client disconnects."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            group.cancel(req)
            return


class EmulatedResponse(Response):
    """Streams (or returns) one request's tokens as the group produces them."""

    def __init__(
        self, group: DecodeGroup, req: EmuRequest, chat: bool, model: str, usage: bool
    ) -> None:
        self.group = group
        self.req = req
        self.chat = chat
        self.model = model
        self.status_code = 200
        self.background = None
        prefix = "chatcmpl-" if chat else "cmpl-"
        self.rid = prefix + req.request_id
        self.created = int(time.time())
        self.usage_wanted = usage
        self.continuous = False  # usage in every chunk (stream_options.continuous_usage_stats)
        self.raw_headers = [(b"x-request-id", req.request_id.encode("latin-1", "replace"))]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        group, req = self.group, self.req
        loop = asyncio.get_running_loop()
        watcher = loop.create_task(_watch_disconnect(receive, group, req))
        try:
            if req.stream:
                await self._stream(send, loop)
            else:
                await self._whole(send, loop)
        finally:
            watcher.cancel()
            if not req.closed:
                group.cancel(req)
            group.release(req)

    async def _stream(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        req, clock = self.req, self.group.clock
        c = Chunks(self.chat, self.rid, self.created, self.model, req.finish_reason, True)
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": SSE_HEADERS + self.raw_headers,
            }
        )
        mid = c.mid
        msg: dict[str, Any] = {"type": "http.response.body", "body": b"", "more_body": True}
        sent = 0
        while True:
            gen = req.generated
            if gen > sent:
                n = gen - sent
                done = gen >= req.target
                if self.continuous:
                    msg["body"] = self._counted(c, sent, gen, done)
                    msg["more_body"] = not done
                elif sent == 0 or done or n > 1:
                    parts = [c.role] if sent == 0 and c.role else []
                    plain = n - 1 if done else n
                    if plain:
                        parts.append(mid if plain == 1 else mid * plain)
                    if done:
                        parts.append(c.last)
                        if self.usage_wanted:
                            parts.append(c.usage(req.prompt_tokens, gen))
                        parts.append(DONE)
                        msg["more_body"] = False
                    msg["body"] = b"".join(parts)
                else:
                    msg["body"] = mid
                await send(msg)
                if sent == 0:
                    req.first_sent_s = clock()
                sent = gen
                if done:
                    return
            elif req.closed or req.cancelled:
                if not req.cancelled:  # aborted by a shutdown: end the stream as vLLM does
                    prompt = req.prompt_tokens
                    end = Chunks.with_usage(c.abort, prompt, sent) if self.continuous else c.abort
                    tail = c.usage(prompt, sent) if self.usage_wanted else b""
                    await send({"type": "http.response.body", "body": end + tail + DONE,
                                "more_body": False})  # fmt: skip
                return
            else:
                fut = loop.create_future()
                req.waker = fut
                await fut

    def _counted(self, c: Chunks, sent: int, gen: int, done: bool) -> bytes:
        """Tokens ``sent + 1 .. gen``, each chunk with the usage so far."""
        prompt = self.req.prompt_tokens
        parts = [Chunks.with_usage(c.role, prompt, 0)] if sent == 0 and c.role else []
        for k in range(sent + 1, gen + 1):
            parts.append(Chunks.with_usage(c.last if done and k == gen else c.mid, prompt, k))
        if done:
            if self.usage_wanted:
                parts.append(c.usage(prompt, gen))
            parts.append(DONE)
        return b"".join(parts)

    async def _whole(self, send: Send, loop: asyncio.AbstractEventLoop) -> None:
        req = self.req
        while not req.closed:
            fut = loop.create_future()
            req.closer = fut
            await fut
        if req.state != FINISHED:
            if not req.cancelled:
                resp = error_response(503, "the emulator shut down", "ServiceUnavailableError")
                await send(
                    {
                        "type": "http.response.start",
                        "status": 503,
                        "headers": [(b"content-type", b"application/json")],
                    }
                )
                await send({"type": "http.response.body", "body": resp.body})
            return
        n = req.generated
        choice = whole_choice(self.chat, 0, TOKEN_TEXT * n, req.finish_reason)
        if not self.chat:
            choice["stop_reason"] = None
        answer = whole_answer(
            self.chat, self.rid, self.created, self.model, [choice], req.prompt_tokens, n
        )
        body = orjson.dumps(answer)
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
            *self.raw_headers,
        ]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        req.first_sent_s = self.group.clock()


def _completion_prompt(prompt: Any) -> str | list[int]:
    """The single prompt of a completion request (batched prompts are refused)."""
    batch = prompt_batch(prompt)
    if len(batch) != 1:
        raise BadRequest(f"the emulator serves one prompt a request, got a batch of {len(batch)}")
    return batch[0]


class RankFront:
    """What the OpenAI endpoints of rank ``rank`` share: the checks every request passes and the
    start of an accepted one."""

    def __init__(self, group: DecodeGroup, rank: int) -> None:
        self.group = group
        self.rank = rank
        self.cfg = group.config
        self.model_name = group.config.model

    def check_common(self, body: CompletionRequest | ChatCompletionRequest) -> None:
        if body.model is not None and body.model != self.model_name:
            raise BadRequest(f"The model `{body.model}` does not exist.", 404, "NotFoundError")
        if body.n != 1:
            raise BadRequest("the emulator supports n = 1 only")

    def target_rank(self, request: Request) -> int:
        """This port's rank, or the rank the configured header names (vLLM's external load
        balancing pins a request to a rank with ``X-data-parallel-rank``)."""
        cfg = self.cfg
        named = request.headers.get(cfg.rank_header) if cfg.rank_header else None
        if named is None:
            return self.rank
        if not named.strip().isdigit() or int(named) >= cfg.ranks:
            raise BadRequest(f"{cfg.rank_header} must be a rank in 0..{cfg.ranks - 1}, got {named!r}")
        return int(named)

    def start(
        self,
        request: Request,
        body: CompletionRequest | ChatCompletionRequest,
        prompt_tokens: int,
        max_tokens: int | None,
        endpoint: str,
    ) -> Response:
        if prompt_tokens < 1:
            raise BadRequest("the prompt is empty")
        limit = self.cfg.max_model_len
        if max_tokens is None:
            max_tokens = limit - prompt_tokens
        if prompt_tokens + max_tokens > limit:
            raise BadRequest(
                f"This model's maximum context length is {limit} tokens. However, you requested "
                f"{prompt_tokens + max_tokens} tokens ({prompt_tokens} in the prompt, "
                f"{max_tokens} in the completion). Please reduce the length of the prompt or "
                "completion."
            )
        rid = request.headers.get("x-request-id") or body.request_id
        group = self.group
        req = group.new_request(
            self.target_rank(request),
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            ignore_eos=body.ignore_eos,
            stream=body.stream,
            endpoint=endpoint,
            request_id=rid,
            recv_s=request.scope.get("state", {}).get("recv_s"),
        )
        group.submit(req)
        options = body.stream_options
        usage = bool(options and options.include_usage)
        response = EmulatedResponse(group, req, endpoint == "chat", self.model_name, usage)
        response.continuous = bool(options and options.continuous_usage_stats)
        return response


def create_rank_app(group: DecodeGroup, rank: int) -> FastAPI:
    """The FastAPI app of rank ``rank`` of ``group``."""
    app = FastAPI(
        title=f"BalanceRoute engine emulator, rank {rank}",
        docs_url=None,
        redoc_url=None,
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(BadRequest, _bad_request)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_middleware(ReceivedAt, clock=group.clock)
    front = RankFront(group, rank)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        """OpenAI completions (text or token-id prompt)."""
        front.check_common(body)
        if body.logprobs is not None or body.prompt_logprobs is not None:
            raise BadRequest("the emulator does not return logprobs")
        if body.echo:
            raise BadRequest("the emulator does not echo prompts")
        if body.best_of not in (None, 1):
            raise BadRequest("the emulator supports best_of = 1 only")
        prompt = _completion_prompt(body.prompt)
        if not isinstance(prompt, str) and any(t < 0 for t in prompt):
            raise BadRequest("token ids must be >= 0")
        return front.start(request, body, count_tokens(prompt), body.max_tokens, "completions")

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request) -> Response:
        """OpenAI chat completions (the prompt is the messages' text)."""
        front.check_common(body)
        if body.logprobs:
            raise BadRequest("the emulator does not return logprobs")
        max_tokens = body.max_completion_tokens or body.max_tokens
        prompt = chat_text([m.model_dump() for m in body.messages])
        return front.start(request, body, count_tokens(prompt), max_tokens, "chat")

    _add_info_routes(app, group, rank)
    add_peer_routes(app, group, rank, front.check_common)
    return app


def _add_info_routes(app: FastAPI, group: DecodeGroup, rank: int) -> None:
    """``GET /v1/models``, ``/health``, ``/metrics`` and ``/v1/emulator/state``."""
    cfg = group.config
    model_name = cfg.model
    state = group.rank_states[rank]

    @app.get("/v1/models")
    async def models() -> Response:
        """The one served model."""
        card = {
            "id": model_name,
            "object": "model",
            "created": int(group.epoch),
            "owned_by": "balanceroute",
            "root": model_name,
            "parent": None,
            "max_model_len": cfg.max_model_len,
        }
        return Response(orjson.dumps({"object": "list", "data": [card]}), media_type=JSON_TYPE)

    @app.get("/health")
    async def health() -> Response:
        """200 while the process serves."""
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics() -> Response:
        """Prometheus text with vLLM's metric names, for this rank."""
        kv = state.load / cfg.kv_capacity
        text = state.metrics.render(len(state.running), len(state.waiting), kv)
        return Response(text, media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/emulator/state")
    async def emulator_state() -> Response:
        """The whole group's counters (not part of any engine's API)."""
        return Response(orjson.dumps({"rank": rank, **group.state()}), media_type=JSON_TYPE)

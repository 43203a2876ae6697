"""The client side of the Protocol data plane: HTTP/1.1 connections parsed by httptools, one
request at a time each (pipelined ones wait their turn), kept alive.

HTTP/1.0 clients are answered as uvicorn's h11 answers them: a stream without chunked framing
(its bytes as they come, the end of the stream being the connection's close), a whole answer
with ``content-length``, and the connection closed after the answer whatever the request's
``Connection`` header says (no keep-alive for 1.0, as h11). A 1.1 request with
``Connection: close`` keeps the chunked framing (h11 too) and is closed after its answer.

A completion request (``POST /v1/completions``, ``POST /v1/chat/completions``) is checked (Host,
Origin and Content-Type; the body's size; the bearer token; the body's fields, with vLLM's 400
naming each bad one), counted and admitted through the decider, and answered by an
:class:`~.exchange.Exchange`. Every other request is passed whole to the gateway's own app
(probes, metrics, A/B, reload, models): called in the process that holds it, or from a relay
worker over the Unix socket where that process's front answers; its answer is passed back.

Bounds: a request's head (request line and headers) over :data:`HEAD_LIMIT` bytes is answered
431 as soon as that much has arrived, before the parser buffers more (h11 and nginx do the same),
and the connection closed after a linger; an ``X-Request-Id`` over :data:`MAX_ID` bytes is refused 400.

Deadlines (:mod:`balanceroute.serving.http.deadline` describes them): a request's headers
within ``header_timeout_s`` of its first byte (or of the connection's opening; else 408 and the
connection is closed), its body within ``body_timeout_s`` more (else closed), and a kept-alive
connection idle for ``idle_timeout_s`` is closed. A client that goes away cancels its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import logging
import os
import socket
from http import HTTPStatus
from typing import Any

import httptools
import httpx
import orjson
from pydantic import BaseModel, ValidationError

from balanceroute.features.prompts import PromptCounter, chat_text, prompt_key
from balanceroute.serving.gateway import errors
from balanceroute.serving.gateway.decider import LiveRequest
from balanceroute.serving.gateway.plane.exchange import Exchange
from balanceroute.serving.gateway.plane.request import PlaneContext
from balanceroute.serving.gateway.upstream import RankPool
from balanceroute.serving.http.deadline import HEAD_LIMIT, HEAD_TOO_LARGE, REQUEST_TIMEOUT, linger
from balanceroute.serving.http.origin_check import OriginCheck
from balanceroute.serving.openai.requests import BodyView, ChatBody, CompletionBody, plain_view
from balanceroute.serving.openai.responses import error_body

log = logging.getLogger("balanceroute.gateway")
JSON = b"application/json"
HOP = {b"connection", b"keep-alive", b"transfer-encoding", b"content-length", b"host"}
ROUTES = {b"/v1/completions": (CompletionBody, False), b"/v1/chat/completions": (ChatBody, True)}
Headers = list[tuple[bytes, bytes]]
MAX_ID = 256  # the longest X-Request-Id taken (it crosses processes and lands in the log)


class BadBody(Exception):
    """The body is not a valid request: ``body`` is vLLM's 400 answer."""

    def __init__(self, body: bytes) -> None:
        super().__init__("bad body")
        self.body = body


def check_body(raw: bytes, model: type[BaseModel]) -> tuple[dict[str, Any], BodyView]:
    """The posted JSON object and what the gateway reads of it (a plain body without the model:
    :func:`plain_view`); :class:`BadBody` naming each bad field."""
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        problems: list[dict[str, Any]] = [{"loc": ("body",), "msg": f"invalid JSON: {exc}"}]
    else:
        if not isinstance(data, dict):
            problems = [{"loc": ("body",), "msg": "the body must be a JSON object"}]
        else:
            view = plain_view(data, model is ChatBody)
            try:
                return data, view or BodyView.of(model.model_validate(data))
            except ValidationError as exc:
                problems = [{**e, "loc": ("body", *e.get("loc", ()))} for e in exc.errors()]
    param = ".".join(str(p) for p in problems[0]["loc"] if p != "body") or None
    raise BadBody(error_body(400, errors.validation_message(problems), "BadRequestError", param))


class Front:
    """What a process's client connections share: the settings, the decider, the connections
    to the ranks, the prompt counter, the requests in flight, and the gateway's app (``app``:
    in this process; ``control``: the Unix socket a relay worker passes its requests to)."""

    def __init__(self, ctx: PlaneContext, counter: PromptCounter, *, app: Any = None,
                 control: str | None = None) -> None:  # fmt: skip
        self.ctx = ctx
        self.settings = ctx.settings
        self.counter = counter
        # the app: called in this process (an app's error is its 500), or over the socket
        to_app = (httpx.AsyncHTTPTransport(uds=control) if app is None
                  else httpx.ASGITransport(app, raise_app_exceptions=False))  # fmt: skip
        self.app = httpx.AsyncClient(transport=to_app, base_url="http://127.0.0.1")
        self.server: asyncio.base_events.Server | None = None
        self.pool = RankPool(ctx.settings, spares=True)
        self.origin = OriginCheck(None, ctx.settings, body=errors.refusal,  # type: ignore[arg-type]
                                  content_type_status=400)  # fmt: skip
        self.token = ctx.settings.token
        self.id_prefix, self.ids = f"gw-{os.urandom(4).hex()}", itertools.count()  # request ids
        self.exchanges: set[Exchange] = set()
        self.connections: set[Connection] = set()
        self.passing: set[asyncio.Task] = set()  # pass-throughs in flight (held: not collected)
        self.idle = asyncio.Event()  # no request in flight
        self.idle.set()

    async def listen(self, sock: socket.socket | None = None, path: str | None = None) -> None:
        """Accept clients on ``sock`` (the shared client port) or the Unix socket ``path``."""
        loop = asyncio.get_running_loop()
        if sock is not None:
            self.server = await loop.create_server(lambda: Connection(self), sock=sock,
                                                   backlog=4096)  # fmt: skip
        else:
            self.server = await loop.create_unix_server(lambda: Connection(self), path)

    def begin_drain(self) -> None:
        """Shutdown began: stop accepting, 503 to new requests, the streams drain."""
        self.ctx.drain.begin()
        if self.server is not None:
            self.server.close()
        self.close_idle()

    def began(self, ex: Exchange) -> None:
        self.exchanges.add(ex)
        self.idle.clear()

    def ended(self, ex: Exchange) -> None:
        self.exchanges.discard(ex)
        if not self.exchanges:
            self.idle.set()

    def drain_over(self) -> None:
        """The drain deadline passed: every request still running ends its answer."""
        for ex in list(self.exchanges):
            ex.cancel(gone=False)

    def close_idle(self) -> None:
        """Shutting down: close every connection not answering a request."""
        for conn in list(self.connections):
            if conn.exchange is None and not conn.busy:
                conn.transport.close()

    async def drained(self, grace_s: float) -> None:
        """Shutting down (the drain begun): wait for the requests in flight until the drain
        deadline, then end the rest (``grace_s`` for their last bytes) and close the pool."""
        if not self.idle.is_set():
            over = asyncio.ensure_future(self.ctx.drain.over.wait())
            quiet = asyncio.ensure_future(self.idle.wait())
            await asyncio.wait({over, quiet}, return_when=asyncio.FIRST_COMPLETED)
            over.cancel()
            quiet.cancel()
        if not self.idle.is_set():
            self.drain_over()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.idle.wait(), grace_s)
        self.pool.close()


class Connection(asyncio.Protocol):
    """One client connection (module docstring)."""

    def __init__(self, front: Front) -> None:
        self.front = front
        self.loop = asyncio.get_running_loop()
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url = b""
        self.headers: Headers = []
        self.body: list[bytes] = []
        self.size = 0
        self.too_big = False
        self.queue: list[tuple[bytes, bytes, Headers, bytes, bool, bool]] = []
        self.exchange: Exchange | None = None
        self.busy = False  # answering a request (an exchange, a pass-through, an error)
        self.keep = True  # keep the connection after the answer in progress
        self.chunked = True  # the answer in progress may be chunked (an HTTP/1.1 request)
        self.http11 = True  # the request being parsed is HTTP/1.1 (else 1.0: h11's rules)
        self.timer: asyncio.TimerHandle | None = None
        self.headers_done = False
        self.head_bytes = 0  # bytes received since the request began, until its headers end
        self.paused = False
        self.dropping = False  # refused: what arrives is dropped until the close
        self.waiting_idle = False  # the timer is the kept-alive connection's idle deadline

    # ---- asyncio ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]
        self.front.connections.add(self)
        self._arm(self.front.settings.header_timeout_s)

    def data_received(self, data: bytes) -> None:
        if self.dropping:
            return
        if not self.headers_done:
            self.head_bytes += len(data)
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._refuse(400, "upgrades are not served here")
        except httptools.HttpParserError as exc:
            self._refuse(400, f"not an HTTP/1.x request: {exc}")
        else:
            if not self.headers_done and self.head_bytes > HEAD_LIMIT:
                self._head_too_large()

    def _head_too_large(self) -> None:
        """431, and a lingering close (an answer in progress: closed at once)."""
        log.warning("closing a connection: its request's head is over %d bytes", HEAD_LIMIT)
        self._disarm()
        self.dropping, self.keep = True, False
        if self.busy:
            self.transport.close()
            return
        self.transport.write(HEAD_TOO_LARGE)
        linger(self.transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self.front.connections.discard(self)
        if self.exchange is not None:
            self.exchange.cancel(gone=True)

    def pause_writing(self) -> None:
        self.paused = True
        if self.exchange is not None:
            self.exchange.pause()

    def resume_writing(self) -> None:
        self.paused = False
        if self.exchange is not None:
            self.exchange.resume()

    # ---- httptools -------------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self.body, self.size = b"", [], [], 0
        self.too_big, self.headers_done = False, False
        if not self.busy and (self.timer is None or self.waiting_idle):
            self._arm(self.front.settings.header_timeout_s)  # from the request's first byte

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        self.headers_done = True
        self.head_bytes = 0
        self.http11 = self.parser.get_http_version() != "1.0"
        if not self.busy:
            self._arm(self.front.settings.body_timeout_s)
        limit = self.front.settings.max_body_bytes
        for k, v in self.headers:
            if k == b"content-length" and v.isdigit() and int(v) > limit:
                self.too_big = True
            elif (k == b"expect" and v.lower() == b"100-continue" and not self.busy
                  and self.http11):  # fmt: skip
                self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")  # curl waits for it
        if self.too_big and not self.busy:  # said so up front: answered now, not read
            self._disarm()
            self._handle(b"", b"", [], b"", False, self.http11)

    def on_body(self, body: bytes) -> None:
        if self.transport.is_closing():
            return
        self.size += len(body)
        if self.size > self.front.settings.max_body_bytes:
            self.too_big = True
        elif not self.too_big:
            self.body.append(body)

    def on_message_complete(self) -> None:
        self.headers_done = False  # what follows is the next request's head
        if self.transport.is_closing():
            return
        method = self.parser.get_method()
        keep = self.http11 and self.parser.should_keep_alive()  # h11: 1.0 is never kept
        request = (method, self.url, self.headers, b"".join(self.body), keep, self.http11)
        if self.too_big:
            request = (b"", b"", [], b"", False, self.http11)
        if self.busy:
            self.queue.append(request)
            self.transport.pause_reading()  # one request waits at most
            return
        self._disarm()
        self._handle(*request)

    # ---- requests --------------------------------------------------------------------------
    def _handle(self, method: bytes, url: bytes, headers: Headers, body: bytes, keep: bool,
                http11: bool) -> None:  # fmt: skip
        self.busy, self.keep, self.chunked = True, keep, http11
        front = self.front
        if not method:  # the body was too big
            limit = front.settings.max_body_bytes
            self.keep = False
            self._json(413, error_body(413, f"the body is above {limit} bytes "
                                       "(BALANCEROUTE_MAX_BODY_BYTES)"))  # fmt: skip
            return
        path = url.partition(b"?")[0]
        scope = {"headers": headers, "method": method.decode("latin-1")}
        refused = front.origin.problem(scope)
        if refused is not None:
            self._json(refused[0], errors.refusal(*refused))
            return
        route = ROUTES.get(path) if method == b"POST" else None
        if route is None:
            task = self.loop.create_task(self._pass(method, url, headers, body))
            front.passing.add(task)
            task.add_done_callback(front.passing.discard)
            return
        if front.token is not None and not self._authorized(headers):
            self._json(401, error_body(401, "missing or invalid bearer token"),
                       [(b"www-authenticate", b"Bearer")])  # fmt: skip
            return
        model, chat = route
        try:
            data, checked = check_body(body, model)
        except BadBody as bad:
            self._json(400, bad.body)
            return
        prompt = chat_text(data["messages"]) if chat else checked.prompt
        self._queue(path.decode(), headers, data, prompt, checked, chat, body)

    def _authorized(self, headers: Headers) -> bool:
        token = self.front.token
        assert token is not None
        given = next((v for k, v in headers if k == b"authorization"), b"")
        scheme, _, value = given.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(value, token.encode())

    def _queue(self, path: str, headers: Headers, data: dict[str, Any], prompt: Any,
               checked: BodyView, chat: bool, raw: bytes) -> None:  # fmt: skip
        """Count the prompt, ask the decider for a rank, and hand the request to an exchange."""
        front, ctx = self.front, self.front.ctx
        if ctx.drain.draining or ctx.decider.lost:
            self.keep = False
            self._json(503, error_body(503, "the gateway is shutting down"),
                       [(b"retry-after", b"1")])  # fmt: skip
            return
        tokens, _ = front.counter.count(prompt)
        key, key_hash = prompt_key(prompt)
        given = next((v for k, v in headers if k == b"x-request-id"), None)
        if given is not None and len(given) > MAX_ID:
            self._json(400, error_body(400, f"X-Request-Id is over {MAX_ID} bytes",
                                       param="x-request-id"))  # fmt: skip
            return
        request_id = given.decode("latin-1") if given else f"{front.id_prefix}{next(front.ids):08x}"
        now = ctx.clock()
        rid, admitted = ctx.decider.admit(tokens, key_hash, key, request_id, checked.stream)
        req = LiveRequest(
            request_id=request_id, path=path, chat=chat, body=data, stream=checked.stream,
            usage=checked.usage, continuous=checked.continuous, prompt_tokens=tokens,
            prompt_key=key, arrival=now, arrival_epoch=0.0, position=-1, admitted=admitted, raw=raw,
        )  # fmt: skip
        ex = Exchange(ctx, front.pool, self, req, rid)
        self.exchange = ex
        front.began(ex)
        ex.start(self._exchange_done)

    def _exchange_done(self, ex: Exchange) -> None:
        self.front.ended(ex)
        if self.exchange is ex:
            self.exchange = None
            if not ex.ended and not self.transport.is_closing():
                self.keep = False  # an answer cut short: the connection cannot be reused
                self._answered()

    async def _pass(self, method: bytes, url: bytes, headers: Headers, body: bytes) -> None:
        """Anything but a completion is the gateway app's: passed whole to it (a HEAD as a GET
        whose body is not sent on: the app's answer is read to its end either way)."""
        head_only = method == b"HEAD"
        method = b"GET" if head_only else method
        headers = [(b"host", b"127.0.0.1"), (b"content-length", b"%d" % len(body)),
                   *((k, v) for k, v in headers if k not in HOP)]  # fmt: skip
        try:
            r = await self.front.app.request(method.decode(), url.decode("latin-1"),
                                             headers=headers, content=body)  # fmt: skip
        except (OSError, httpx.HTTPError) as exc:
            self._json(503, error_body(503, f"the gateway's decider does not answer: {exc}"))
            return
        if self.transport.is_closing():
            return
        self.respond(r.status_code, [(k, v) for k, v in r.headers.raw if k not in HOP], r.content,
                     head_only)  # fmt: skip

    # ---- answers (also the exchange's) ---------------------------------------------------
    def respond(self, status: int, headers: Headers, body: bytes, head_only: bool = False) -> None:
        """A whole answer with ``content-length`` (``head_only``: a HEAD's, without the body)."""
        lines = [b"HTTP/1.1 %d %s" % (status, _phrase(status))]
        lines += [k + b": " + v for k, v in headers]
        lines.append(b"content-length: %d" % len(body))
        if not self.keep:
            lines.append(b"connection: close")
        self.transport.write(b"\r\n".join(lines) + b"\r\n\r\n" + (b"" if head_only else body))
        self._answered()

    def start_stream(self, headers: Headers, first: bytes = b"") -> None:
        """A stream's head, and its ``first`` bytes in the same write (one segment to the
        client): chunked to an HTTP/1.1 client; to a 1.0 one no framing at all (the close ends
        it: :meth:`end_stream`)."""
        lines = [b"HTTP/1.1 200 OK", *(k + b": " + v for k, v in headers)]
        if self.chunked:
            lines.append(b"transfer-encoding: chunked")
        else:
            self.keep = False
        if not self.keep:
            lines.append(b"connection: close")
        head = b"\r\n".join(lines) + b"\r\n\r\n"
        if first:
            head += b"%x\r\n%b\r\n" % (len(first), first) if self.chunked else first
        self.transport.write(head)

    def write_chunk(self, data: bytes) -> None:
        if self.chunked:
            self.transport.write(b"%x\r\n%b\r\n" % (len(data), data))
        else:
            self.transport.write(data)

    def end_stream(self, last: bytes = b"") -> None:
        """The stream's end, after its ``last`` bytes in the same write: the last chunk (1.1),
        or the connection's close (1.0)."""
        if self.chunked:
            self.transport.write(
                b"%x\r\n%b\r\n0\r\n\r\n" % (len(last), last) if last else b"0\r\n\r\n"
            )
        elif last:
            self.transport.write(last)
        self._answered()

    def _json(self, status: int, body: bytes, extra: Headers | None = None) -> None:
        self.respond(status, [(b"content-type", JSON), *(extra or [])], body)

    def _answered(self) -> None:
        """The answer is written: the next request, the idle deadline, or close."""
        self.busy = False
        if not self.keep or self.front.ctx.drain.draining:
            self.transport.close()
            return
        if self.queue:
            self.transport.resume_reading()
            self._handle(*self.queue.pop(0))
            return
        self._arm(self.front.settings.idle_timeout_s, idle=True)

    def _refuse(self, status: int, message: str) -> None:
        self.keep = False
        if not self.busy:
            self._json(status, error_body(status, message))
        else:
            self.transport.close()

    # ---- deadlines -------------------------------------------------------------------------
    def _arm(self, seconds: float, idle: bool = False) -> None:
        self._disarm()
        self.timer = self.loop.call_later(seconds, self._expired, idle)
        self.waiting_idle = idle

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self, idle: bool) -> None:
        self.timer = None
        if self.transport.is_closing() or self.busy:
            return
        if not idle:
            stage = "body" if self.headers_done else "headers"
            log.warning("closing a connection: its request's %s did not arrive in time", stage)
            if not self.headers_done:
                self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()


def _phrase(status: int) -> bytes:
    try:
        return HTTPStatus(status).phrase.encode()
    except ValueError:
        return b"Status"

"""The bytes of one request through the gateway: forward it to the rank it was given, relay the
stream back and count its tokens. Its life in the group (pool, admission, progress, departure,
exactly once) is :class:`~balanceroute.serving.gateway.life.RequestLife`'s.

The upstream request always streams, with ``stream_options`` asking for usage in every chunk
(vLLM's ``continuous_usage_stats``; SGLang accepts it too); what the client did not ask for is
stripped before relaying (the per-chunk usage, the final usage chunk), everything else is relayed
as the rank sent it, event by event. A request's age is the rank's cumulative
``usage.completion_tokens`` when it sends one, else the number of token chunks. A non-streaming
client gets the assembled answer once the stream ends.

Faults. Until the first token has been relayed the client has seen nothing, so a rank that
fails then (connection refused or broken, a 5xx or 429 answer, a 401/403 refusing the
gateway's upstream key, the stream ending early) is taken
out of rotation and the request goes back to the head of the pool, to be routed again (at most
``max_attempts`` ranks); a rank's 4xx is the client's answer and is relayed. After the first
token the client gets an SSE error event and ``[DONE]``. Deadlines: a first token within
``first_token_timeout_s`` of forwarding (else the rank failed: re-routed), and a chunk within
``chunk_timeout_s`` of the last once the stream started (else an SSE error event and
``[DONE]``). A rank that aborts the request
(``finish_reason`` ``abort``: vLLM stopping gracefully) before its first token is a failed rank
too (re-routed); after it, the client gets the stream as the rank ended it, and the request is
counted ``aborted``, kept out of the completion log (its length is not the request's). A
non-streaming client gets every field the rank sent (:mod:`balanceroute.serving.openai.assemble`),
and every answer carries ``x-request-id``. A request still queued when no rank has been in
rotation for ``no_rank_wait_s`` gets 503 with ``Retry-After`` (:class:`NoRankInRotation`). A client that disconnects cancels the
upstream request (its connection is closed, which aborts it on the rank) and frees the slot.
"""

from __future__ import annotations

import asyncio
import math
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
import orjson
from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from balanceroute.serving.gateway.life import LiveRequest, NoRankInRotation, RequestLife
from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.openai.assemble import Assembler
from balanceroute.serving.openai.responses import error_body
from balanceroute.serving.openai.sse import (
    DONE,
    DONE_PAYLOAD,
    SSE_HEADERS,
    EventSplitter,
    data_payload,
    token_text,
)

RETRY, FINISHED = "retry", "finished"
ABORT = "abort"  # vLLM's finish_reason for a request the engine stopped (shutdown, abort)


class UpstreamBroke(Exception):
    """The rank's stream ended without ``[DONE]``."""


@dataclass
class Stream:
    """What one attempt has received so far."""

    chunks: int = 0
    usage_completion: int = -1
    usage_prompt: int = -1
    finish_reason: str | None = None
    first_t: float | None = None
    last_t: float | None = None
    done: bool = False
    held: list[bytes] = field(default_factory=list)  # events not yet relayed
    whole: Assembler | None = None  # non-streaming clients: the answer being folded
    model: str | None = None

    @property
    def tokens(self) -> int:
        return self.usage_completion if self.usage_completion >= 0 else self.chunks


def upstream_body(body: dict[str, Any]) -> bytes:
    """The body sent to the rank: streaming, usage in every chunk."""
    out = dict(body)
    out["stream"] = True
    options = dict(out.get("stream_options") or {})
    options.update(include_usage=True, continuous_usage_stats=True)
    out["stream_options"] = options
    return orjson.dumps(out)


def read_event(req: LiveRequest, event: bytes, st: Stream, now: float) -> bytes | None:
    """Count one SSE event of ``req``'s stream into ``st``; what to relay of it (None:
    nothing). UpstreamBroke on an error event or an abort before the first token."""
    payload = data_payload(event)
    if payload is None:  # a comment is relayed as it came, an empty event dropped
        return event + b"\n\n" if event.strip() else None
    if payload == DONE_PAYLOAD:
        st.done = True
        return DONE
    if (
        req.stream
        and st.model is not None
        and b'"finish_reason":null' in payload
        and b'"usage"' not in payload
        and b'"error"' not in payload
        and not (req.chat and b'"role"' in payload)
    ):  # a plain token chunk (one choice, n = 1): counted without parsing it
        st.chunks += 1
        st.last_t = now
        if st.first_t is None:
            st.first_t = now
        return event + b"\n\n"
    obj = orjson.loads(payload)
    if obj.get("error"):
        raise UpstreamBroke(f"error event: {str(obj['error'])[:200]}")
    usage = obj.get("usage")
    choices = obj.get("choices") or []
    if st.first_t is None and any(c.get("finish_reason") == ABORT for c in choices):
        raise UpstreamBroke("the rank aborted the request before its first token")
    if st.model is None:
        st.model = obj.get("model")
    if st.whole is not None:
        st.whole.add(obj)
    for choice in choices:
        piece = token_text(choice)
        if piece is not None:
            st.chunks += 1
            if st.first_t is None:
                st.first_t = now
            st.last_t = now
        reason = choice.get("finish_reason")
        if reason is not None:
            st.finish_reason = reason
    if usage:
        st.usage_completion = int(usage.get("completion_tokens") or 0)
        st.usage_prompt = int(usage.get("prompt_tokens") or 0)
    if not req.stream:
        return None
    if not choices and usage is not None:  # the final usage chunk
        return event + b"\n\n" if req.usage else None
    if "usage" in obj and not req.continuous:
        del obj["usage"]
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    return event + b"\n\n"


def report_finish(
    life: Any, req: LiveRequest, rank: int, st: Stream, now: float
) -> tuple[int, int]:
    """Tell the request's life that its stream ended with ``[DONE]``: a completion with its
    tokens and times, or an abort (cut short by the rank: not a completion to learn from);
    the output and prompt tokens counted."""
    if st.first_t is None:  # no token at all (max_tokens reached at once?): still an answer
        st.first_t = st.last_t = now
    tokens = max(1, st.tokens)
    prompt = st.usage_prompt if st.usage_prompt > 0 else req.prompt_tokens
    if st.finish_reason == ABORT:
        life.abandoned("aborted")
    else:
        life.finished(rank, st.first_t, st.last_t or st.first_t, tokens, prompt, now,
                      st.finish_reason)  # fmt: skip
    return tokens, prompt


class Relay(Response):
    """Runs one request to the end: the handler's response, an ASGI app of its own, so a
    disconnect is seen at once (it sends its own status and headers)."""

    def __init__(self, gw: Gateway, req: LiveRequest) -> None:
        self.status_code = 200
        self.background = None
        self.raw_headers = []
        self.life = RequestLife(gw, req)
        self.req = req
        self.started = False  # a token (and the response start) reached the client
        self.ended = False  # the answer's last message was sent
        self.opened = False  # a whole answer's start was sent

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        work = asyncio.ensure_future(self.run(send))
        watch = asyncio.ensure_future(_disconnected(receive))
        drained = asyncio.ensure_future(self.life.gw.drain.over.wait())
        try:
            await asyncio.wait({work, watch, drained}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():  # the client went away, or the drain deadline passed
                work.cancel()
                self.life.count("cancelled" if watch.done() else "drained")
            try:
                await work
            except asyncio.CancelledError:
                if not (watch.done() or drained.done()):
                    raise
            if drained.done() and not watch.done() and not self.ended:
                await self._end_drained(send)
        finally:
            watch.cancel()
            drained.cancel()
            self.life.leave()  # however the request ended, it leaves the group once

    async def _end_drained(self, send: Send) -> None:
        """The drain deadline passed first: end the answer in the client's format."""
        message = "the gateway shut down before the request finished (drain deadline)"
        if self.started:
            await _send_event_error(send, message)
        elif not self.opened:
            await self._send_error(send, 503, message)
        self.ended = True

    # ---- the request's life ---------------------------------------------------------------
    async def run(self, send: Send) -> None:
        life = self.life
        body = upstream_body(self.req.body)
        attempts = life.max_attempts
        for attempt in range(attempts):
            try:
                rank = await life.admitted()
            except NoRankInRotation as exc:
                life.abandoned("no_rank")
                retry = max(1, math.ceil(self.settings.health_interval_s))
                await self._send_error(send, 503, str(exc), retry_after=retry)
                return
            outcome = await self.forward(rank, body, send)
            if outcome == FINISHED:
                return
            if not life.requeued(rank, last=attempt + 1 == attempts):
                break
        life.abandoned("failed")
        await self._send_error(
            send, 502, f"no rank could serve the request after {attempt + 1} attempts"
        )

    async def forward(self, rank: int, body: bytes, send: Send) -> str:
        """One attempt on ``rank``: FINISHED (answered, well or not) or RETRY (nothing reached
        the client and the rank failed)."""
        life = self.life
        url, headers = life.forwarded(rank)
        st = Stream(whole=None if self.req.stream else Assembler(self.req.chat))
        try:
            async with (
                asyncio.timeout(self.settings.first_token_timeout_s) as deadline,
                life.session.post(url, data=body, headers=headers) as resp,
            ):
                if resp.status != 200:
                    content = await resp.read()
                    if resp.status >= 500 or resp.status == 429:
                        life.rank_failed(rank, f"answered {resp.status}")
                        return RETRY
                    if resp.status in (401, 403):  # the gateway's key, not the client's fault
                        life.rank_refused(rank, resp.status)
                        return RETRY
                    life.abandoned("rank_refused")
                    kind = resp.headers.get("content-type", "application/json")
                    await self._send_whole(send, resp.status, content, kind)
                    return FINISHED
                await self._relay(resp, st, send, deadline)
        except (aiohttp.ClientError, OSError, TimeoutError, UpstreamBroke) as exc:
            why = self._why(exc, st)
            if st.first_t is None:  # the rank produced nothing: known not to have started
                life.rank_failed(rank, why)
                return RETRY
            life.abandoned("broken")
            message = f"rank {rank} failed after the first token ({why})"
            if self.started:
                await _send_event_error(send, message)
                self.ended = True
            else:
                await self._send_error(send, 502, message)
            return FINISHED
        await self._finish(rank, st, send)
        return FINISHED

    @property
    def settings(self) -> Any:
        return self.life.gw.settings

    def _why(self, exc: BaseException, st: Stream) -> str:
        """What went wrong, in words (a deadline names its setting)."""
        if isinstance(exc, TimeoutError):
            if st.first_t is None:
                return (f"no first token within {self.settings.first_token_timeout_s:g} s "
                        "(--first-token-timeout)")  # fmt: skip
            return f"no chunk for {self.settings.chunk_timeout_s:g} s (--chunk-timeout)"
        return f"{type(exc).__name__}: {exc}"

    async def _relay(
        self, resp: aiohttp.ClientResponse, st: Stream, send: Send, deadline: asyncio.Timeout
    ) -> None:
        splitter = EventSplitter()
        loop = asyncio.get_running_loop()
        chunk_s = self.settings.chunk_timeout_s
        async for data in resp.content.iter_any():
            if st.first_t is not None:  # started: the next chunk is due within chunk_s
                deadline.reschedule(loop.time() + chunk_s)
            events = splitter.feed(data)
            if not events:
                continue
            now = self.life.clock()
            before = st.tokens
            out = [b for ev in events if (b := self._event(ev, st, now)) is not None]
            if st.tokens > before:
                self._progress(st, st.tokens - before, now)
            if self.req.stream:
                if self.started:
                    if out:
                        await send(
                            {"type": "http.response.body", "body": b"".join(out), "more_body": True}
                        )
                else:
                    st.held.extend(out)
                    if st.first_t is not None:
                        await self._start_stream(send, st)
            if st.first_t is not None:
                deadline.reschedule(loop.time() + chunk_s)
            if st.done:
                return
        raise UpstreamBroke("the stream ended before data: [DONE]")

    def _event(self, event: bytes, st: Stream, now: float) -> bytes | None:
        """Count one SSE event; what to relay of it (None: nothing)."""
        return read_event(self.req, event, st, now)

    def _progress(self, st: Stream, new: int, now: float) -> None:
        self.life.progress(st.tokens, new, st.usage_prompt, now)

    async def _start_stream(self, send: Send, st: Stream) -> None:
        headers = [*SSE_HEADERS, self._rid_header()]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        self.started = True
        body, st.held = b"".join(st.held), []
        if body:
            await send({"type": "http.response.body", "body": body, "more_body": True})

    async def _finish(self, rank: int, st: Stream, send: Send) -> None:
        req = self.req
        tokens, prompt = report_finish(self.life, req, rank, st, self.life.clock())
        if req.stream:
            if not self.started:
                await self._start_stream(send, st)
            await send({"type": "http.response.body", "body": b"", "more_body": False})
            self.ended = True
            return
        assert st.whole is not None
        rid = f"{'chatcmpl' if req.chat else 'cmpl'}-{req.request_id}"
        answer = st.whole.answer(prompt, tokens, rid, int(time.time()))
        await self._send_whole(send, 200, orjson.dumps(answer), "application/json")

    def _rid_header(self) -> tuple[bytes, bytes]:
        return b"x-request-id", self.req.request_id.encode("latin-1", "replace")

    async def _send_whole(self, send: Send, status: int, body: bytes, content_type: str,
                          retry_after: int | None = None) -> None:  # fmt: skip
        """A whole answer (not a stream), with the request's ``x-request-id`` (and
        ``Retry-After`` when given)."""
        headers = [
            (b"content-type", content_type.encode("latin-1")),
            (b"content-length", str(len(body)).encode()),
            self._rid_header(),
        ]
        if retry_after is not None:
            headers.append((b"retry-after", str(retry_after).encode()))
        self.opened = True
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
        self.ended = True

    async def _send_error(self, send: Send, status: int, message: str,
                          retry_after: int | None = None) -> None:  # fmt: skip
        await self._send_whole(send, status, error_body(status, message), "application/json",
                               retry_after)  # fmt: skip


async def _disconnected(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


async def _send_event_error(send: Send, message: str) -> None:
    body = b"data: " + error_body(502, message) + b"\n\n" + DONE
    await send({"type": "http.response.body", "body": body, "more_body": False})

"""One completion request through the data plane, from its admission to its answer's end: the
gateway's one relay, with its fault rules. Its life is reported to the decider (the decider
itself, or a relay worker's proxy), each call once.

Until the first token the rank's stream is read event by event (:func:`~.request.read_event`).
After it every piece read is written to the client's socket as one HTTP chunk up to its last
complete event, with one search for the events that matter (a set ``finish_reason``, a
``usage`` object, ``[DONE]``, an ``error``: only those are parsed, :func:`~.request.matters`) and
one count of ``data:`` lines. The rank is paused while the client's socket is full. A
non-streaming client gets the answer assembled from every event
(:mod:`balanceroute.serving.openai.assemble`); every answer carries ``x-request-id``.

Faults. Until the first token has reached the client it has seen nothing, so a rank that fails
then (connection refused or broken, a 5xx or 429 answer, a 401/403 refusing the gateway's
upstream key, the stream ending early or at ``[DONE]`` alone, an abort: a vLLM that stops) is out of
rotation and the request goes back to the head of the pool, to be routed again (at most
``max_attempts`` ranks); a rank's other 4xx is the client's answer and is relayed. After the
first token the client gets an SSE error event and ``[DONE]``: so does a stream that is not valid
SSE (:func:`~.request.well_formed`), never relayed; either is never a completion-log row and
counts against its rank (:meth:`~..health.RankHealth.broke`). Deadlines: a first token within
``first_token_timeout_s`` of forwarding (else the rank failed: re-routed), and a chunk within
``chunk_timeout_s`` of the last once the stream started (else an SSE error event and
``[DONE]``). An abort after the first token ends the stream as the rank ended it, counted
``aborted`` and kept out of the completion log (its length is not the request's). A request
still queued when no rank has been in rotation for ``no_rank_wait_s`` gets 503 with
``Retry-After``. A client that disconnects cancels the upstream request (its connection is
closed, which aborts it on the rank) and frees the slot; at the drain deadline the answers
still running end in the client's format.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson

from balanceroute.serving.gateway.decider import BROKEN, LiveRequest, Rejected
from balanceroute.serving.gateway.plane.request import (
    ABORT,
    BAD,
    FINISHED,
    MARKED,
    RETRY,
    PlaneContext,
    Stream,
    UpstreamBroke,
    classify,
    rank_body,
    read_event,
)
from balanceroute.serving.gateway.runtime import forward_headers
from balanceroute.serving.gateway.upstream import RankPool, Upstream
from balanceroute.serving.openai.assemble import Assembler
from balanceroute.serving.openai.responses import error_body
from balanceroute.serving.openai.sse import DONE, SSE_HEADERS, EventSplitter

log = logging.getLogger("balanceroute.gateway")
Headers = list[tuple[bytes, bytes]]
STALE = "stale"  # a connection closed before a byte of the answer
TRIES = 4  # connections an attempt tries when kept-alive ones turn out closed


@dataclass(frozen=True)
class Sent:
    """A first attempt written before the request's task ran (:meth:`Exchange.start`)."""

    rank: int
    body: bytes  # the body sent to ranks (again on a retry)
    request: bytes  # head and body, as written


def request_head(pool: RankPool, rank: int, path: str, headers: dict[str, str],
                 length: int) -> bytes:  # fmt: skip
    """The request line and headers of a forwarded request."""
    _, _, prefix, host = pool.address(rank)
    lines = [b"POST " + (prefix + path).encode() + b" HTTP/1.1", b"host: " + host]
    lines += [k.encode("latin-1") + b": " + v.encode("latin-1") for k, v in headers.items()]
    lines.append(b"content-length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


class Exchange:
    """One request's attempts and answer (module docstring)."""

    def __init__(self, ctx: PlaneContext, pool: RankPool, client: Any, req: LiveRequest,
                 rid: int) -> None:  # fmt: skip
        self.ctx = ctx
        self.pool = pool
        self.client = client
        self.req = req
        self.decider = ctx.decider
        self.rid = rid  # the decider's number for the request
        self.left = False  # the request left the decider's group (finished or abandoned)
        self.loop = asyncio.get_running_loop()
        self.settings = ctx.settings
        self.started = False  # the stream's head (and a token) reached the client
        self.ended = False  # the answer's last byte was written
        self.gone = False  # the client went away
        self.drained = False  # the drain deadline passed
        self.up: Upstream | None = None
        self.st = Stream()
        self.status = 0
        self.streaming = False  # the stream reached the client: pieces go straight to _relay
        self.error = bytearray()  # a refusal's body
        self.splitter = EventSplitter()
        self.held = b""
        self.result: asyncio.Future[str] | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.last = 0.0  # loop time of the last piece read after the first token
        self.rank = -1
        self.task: asyncio.Task | None = None
        self.why = ""

    # ---- the request's life ----------------------------------------------------------------
    def start(self, on_done: Callable[[Exchange], None]) -> None:
        """Run the request in its own task; ``on_done`` when it has left for good. A request
        the decider admitted at once goes to its rank now, over an idle kept-alive connection
        if there is one, without waiting for the task's first pass of the event loop."""
        sent = self._send_at_once()
        self.task = self.loop.create_task(self.serve(sent))
        self.task.add_done_callback(lambda _: on_done(self))

    def _send_at_once(self) -> Sent | None:
        """The first attempt written now, if the request is admitted and its rank has an idle
        connection (else None: the task makes the attempt)."""
        fut = self.req.admitted
        ok = fut.done() and not fut.cancelled() and fut.exception() is None
        rank = fut.result() if ok else -1
        if rank < 0:
            return None
        up = self.pool.idle_connection(rank)
        if up is None:
            return None
        body = rank_body(self.req.body, self.req.raw)
        request = self._prepare(rank, body)
        self.up = up
        up.send(self, request)
        return Sent(rank, body, request)

    async def serve(self, sent: Sent | None = None) -> None:
        try:
            await self.run(sent)
        except asyncio.CancelledError:
            self._drop_upstream()
            self.decider.count("cancelled" if self.gone else "drained")
            if self.drained and not self.gone and not self.ended:
                self._end_drained()
        finally:
            self._disarm()
            self._leave(None)  # however the request ended, it leaves the group once

    async def run(self, sent: Sent | None = None) -> None:
        body = sent.body if sent is not None else rank_body(self.req.body, self.req.raw)
        attempts = self.settings.max_attempts
        attempt = 0
        try:
            for attempt in range(attempts):
                if sent is not None:  # the first attempt is on its way (:meth:`start`)
                    outcome, sent = await self.attempt(sent.rank, body, sent), None
                else:
                    rank = await self.req.admitted
                    if rank < 0:
                        break
                    outcome = await self.attempt(rank, body)
                if outcome == FINISHED:
                    return
                again = self.decider.requeued(self.rid, self.rank, attempt + 1 == attempts)
                if again is None:
                    break
                self.req.admitted = again
        except Rejected as no:
            self._leave(None)
            self._whole(no.status, error_body(no.status, no.message), b"application/json",
                        [(b"retry-after", b"1")])  # fmt: skip
            return
        self._leave("failed")
        self._error(502, f"no rank could serve the request after {attempt + 1} attempts")

    def cancel(self, *, gone: bool) -> None:
        """The client went away (``gone``) or the drain deadline passed: stop the request."""
        if self.ended:
            return
        if gone:
            self.gone = True
        else:
            self.drained = True
        if self.task is not None and not self.task.done():
            self.task.cancel()

    # ---- one attempt -----------------------------------------------------------------------
    def _prepare(self, rank: int, body: bytes) -> bytes:
        """A new attempt on ``rank``: its state and first-token deadline; the request's bytes."""
        self.rank = rank
        self.st = Stream(whole=None if self.req.stream else Assembler(self.req.chat))
        self.status, self.error, self.held, self.streaming = 0, bytearray(), b"", False
        self.splitter = EventSplitter()
        self.result = self.loop.create_future()
        self.timer = self.loop.call_later(self.settings.first_token_timeout_s, self._first_late)
        headers = forward_headers(self.settings, self.ctx.upstream_key, rank, self.req.request_id)
        return request_head(self.pool, rank, self.req.path, headers, len(body)) + body

    async def attempt(self, rank: int, body: bytes, sent: Sent | None = None) -> str:
        """One attempt on ``rank``: FINISHED (answered, well or not) or RETRY (nothing reached
        the client and the rank failed). ``sent``: the request was written already, on a
        kept-alive connection (:meth:`_send_at_once`)."""
        request = self._prepare(rank, body) if sent is None else sent.request
        assert self.result is not None
        for _ in range(TRIES):
            if sent is not None:
                reused, sent = True, None
            else:
                try:
                    up, reused = await self.pool.connect(rank)
                except (OSError, TimeoutError) as exc:
                    self._disarm()
                    why = (f"no connection within {self.settings.connect_timeout_s:g} s"
                           if isinstance(exc, TimeoutError) else f"{type(exc).__name__}: {exc}")  # fmt: skip
                    self.decider.failed(self.rid, rank, why)
                    return RETRY
                if self.result.done():  # the first-token deadline passed while connecting
                    self.pool.put(up)
                    return self.result.result()
                self.up = up
                up.send(self, request)
            outcome = await self.result
            if outcome != STALE:
                return outcome
            if not reused:
                break
            # a kept-alive connection the rank closed just now: not the rank's fault, again
            self.result = self.loop.create_future()
        self._disarm()
        self.decider.failed(self.rid, rank, self.why)
        return RETRY

    def _resolve(self, outcome: str) -> None:
        self._disarm()
        if self.result is not None and not self.result.done():
            self.result.set_result(outcome)

    # ---- what the upstream connection hears ------------------------------------------------
    def head(self, status: int) -> None:
        self.status = status

    def body(self, data: bytes) -> None:
        if self.streaming:  # the common case, first
            self._relay(data)
            return
        if self.status != 200:
            if len(self.error) < 1 << 20:
                self.error += data
            return
        st = self.st
        if st.first_t is not None:  # a whole answer being assembled: the chunk deadline
            self.last = self.loop.time()
        try:
            events = self.splitter.feed(data)
            if not events:
                return
            now = self.ctx.clock()
            waiting = st.first_t is None
            out = [b for ev in events if (b := read_event(self.req, ev, st, now)) is not None]
        except (UpstreamBroke, ValueError) as exc:
            self._fail(str(exc))
            return
        if waiting and st.first_t is not None:
            if self.req.stream:  # the client's first token before the decider's bookkeeping
                self._start_stream(b"".join(out))
                self.held = self.splitter.buf
                self.streaming = True
                if self.up is not None:
                    self.up.relaying = True
            self._started_reading()  # the chunk deadline, after the client's first token
            if st.tokens > 0:  # only the first token is news to the decider
                self.decider.first_token(self.rid, now)
        elif self.req.stream:
            self.st.held.extend(out)
        if st.done:
            self._finish()

    def complete(self) -> None:
        self.up = None  # the connection went back to its rank's list (or closed)
        if self.result is None or self.result.done():
            return
        status = self.status
        if status == 200:
            self._fail("the stream ended before data: [DONE]")
        elif status >= 500 or status == 429:
            self.decider.failed(self.rid, self.rank, f"answered {status}")
            self._resolve(RETRY)
        elif status in (401, 403):  # the gateway's key, not the client's fault
            self.decider.refused(self.rid, self.rank, status)
            self._resolve(RETRY)
        else:
            self._leave("rank_refused")
            self._whole(status, bytes(self.error), b"application/json")
            self._resolve(FINISHED)

    def broken(self, why: str) -> None:
        up, self.up = self.up, None
        if self.result is None or self.result.done():
            return
        if up is not None and not up.heard and self.status == 0:
            self.why = why
            self.result.set_result(STALE)  # attempt() tries another connection, or gives up
            return
        self._fail(why)

    # ---- the stream --------------------------------------------------------------------------
    def _relay(self, data: bytes) -> None:
        """A piece after the first token: to the client up to its last complete event."""
        self.last = self.loop.time()
        buf = self.held + data if self.held else data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            self.held = buf
            return
        whole, self.held = buf[: cut + 2], buf[cut + 2 :]
        kind = classify(whole)
        if kind == BAD:  # never relayed, never a training row; counts against the rank
            log.warning("rank %d sent a stream that is not valid SSE: %r", self.rank, whole[:120])
            self._fail("its stream is not valid SSE")
            return
        st = self.st
        if kind == MARKED:
            now = self.ctx.clock()
            events = whole.split(b"\n\n")
            events.pop()
            try:
                whole = b"".join(b for ev in events
                                 if (b := read_event(self.req, ev, st, now)) is not None)  # fmt: skip
            except (UpstreamBroke, ValueError) as exc:
                self._fail(str(exc))
                return
        else:
            st.chunks += whole.count(b"data:")
        if st.done:  # the last events and the stream's end in one write
            self._finish(whole)
        elif whole:
            self.client.write_chunk(whole)

    def _started_reading(self) -> None:
        """The first token arrived: from now on a chunk is due within ``chunk_timeout_s``."""
        self._disarm()
        self.last = self.loop.time()
        self.timer = self.loop.call_later(self.settings.chunk_timeout_s, self._chunk_late)

    def _start_stream(self, first: bytes) -> None:
        held, self.st.held = b"".join(self.st.held), []
        self.client.start_stream([*SSE_HEADERS, self._rid_header()], held + first)
        self.started = True

    def _finish(self, last: bytes = b"") -> None:
        """``[DONE]``: the request finished on its rank (``last``: the stream's last events,
        not yet written)."""
        st, req = self.st, self.req
        if st.tokens == 0 and st.finish_reason is None:  # [DONE] alone: a rank that stopped
            self._fail("the stream ended before a token or a finish reason")
            return
        if self.up is not None:
            self.up.release()
            self.up = None
        tokens, prompt = self._report_finish()
        if req.stream:
            if not self.started:
                self._start_stream(b"")
            self.client.end_stream(last)
            self.ended = True
        else:
            assert st.whole is not None
            rid = f"{'chatcmpl' if req.chat else 'cmpl'}-{req.request_id}"
            answer = st.whole.answer(prompt, tokens, rid, int(time.time()))
            self._whole(200, orjson.dumps(answer), b"application/json")
        self._resolve(FINISHED)

    def _report_finish(self) -> tuple[int, int]:
        """The stream ended with ``[DONE]``: to the decider a completion with its tokens and
        times, or an abort (cut short by the rank: not a completion to learn from); the output
        and prompt tokens counted."""
        st, now = self.st, self.ctx.clock()
        if st.first_t is None:  # no token at all (max_tokens reached at once?): still an answer
            st.first_t = st.last_t = now
        tokens = max(1, st.tokens)
        prompt = st.usage_prompt if st.usage_prompt > 0 else self.req.prompt_tokens
        if st.finish_reason == ABORT:
            self._leave("aborted")
        else:
            self.left = True
            self.decider.finished(self.rid, self.rank, st.first_t, st.last_t or st.first_t,
                                  tokens, prompt, st.finish_reason)  # fmt: skip
        return tokens, prompt

    def _leave(self, outcome: str | None) -> None:
        """The request leaves the decider's group once (``outcome`` counted, even after)."""
        if not self.left:
            self.left = True
            self.decider.abandoned(self.rid, outcome)
        elif outcome is not None:
            self.decider.count(outcome)

    def _fail(self, why: str) -> None:
        """The attempt failed: re-routed before the first token, else the answer ends with an
        error."""
        self._drop_upstream()
        if self.result is None or self.result.done():
            return
        if self.st.first_t is None:  # the rank produced nothing: known not to have started
            self.decider.failed(self.rid, self.rank, why)
            self._resolve(RETRY)
            return
        self._leave(BROKEN)
        message = f"rank {self.rank} failed after the first token ({why})"
        if self.started:
            self._event_error(message)
        else:
            self._error(502, message)
        self._resolve(FINISHED)

    def _first_late(self) -> None:
        self.timer = None
        self._fail(f"no first token within {self.settings.first_token_timeout_s:g} s "
                   "(--first-token-timeout)")  # fmt: skip

    def _chunk_late(self) -> None:
        chunk_s = self.settings.chunk_timeout_s
        idle = self.loop.time() - self.last
        if idle < chunk_s:
            self.timer = self.loop.call_later(chunk_s - idle, self._chunk_late)
            return
        self.timer = None
        self._fail(f"no chunk for {chunk_s:g} s (--chunk-timeout)")

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _drop_upstream(self) -> None:
        """Close the attempt's connection: the rank cancels the request."""
        up, self.up = self.up, None
        if up is not None:
            up.close()

    # ---- flow control ------------------------------------------------------------------------
    def pause(self) -> None:
        if self.up is not None:
            self.up.pause()

    def resume(self) -> None:
        if self.up is not None:
            self.up.resume()

    # ---- answers -----------------------------------------------------------------------------
    def _rid_header(self) -> tuple[bytes, bytes]:
        return b"x-request-id", self.req.request_id.encode("latin-1", "replace")

    def _whole(self, status: int, body: bytes, kind: bytes, extra: Headers | None = None) -> None:
        headers = [(b"content-type", kind), self._rid_header(), *(extra or [])]
        self.client.respond(status, headers, body)
        self.ended = True

    def _error(self, status: int, message: str) -> None:
        self._whole(status, error_body(status, message), b"application/json")

    def _event_error(self, message: str) -> None:
        self.client.write_chunk(b"data: " + error_body(502, message) + b"\n\n" + DONE)
        self.client.end_stream()
        self.ended = True

    def _end_drained(self) -> None:
        """The drain deadline passed first: end the answer in the client's format."""
        message = "the gateway shut down before the request finished (drain deadline)"
        if self.started:
            self._event_error(message)
        else:
            self._error(503, message)

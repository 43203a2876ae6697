"""A relayed request: its life reported to the decider (:class:`Life`, through a
:class:`DeciderPort`) and its rank's SSE stream as the relay reads it: what one attempt has received (:class:`Stream`),
one event counted and trimmed for the client (:func:`read_event`), the quick search for the
events that matter once a stream runs (:func:`matters`), the body sent to a rank
(:func:`rank_body`) and the finish reported to the decider (:func:`report_finish`).

A request's age is the rank's cumulative ``usage.completion_tokens`` when it sends one, else the
number of token chunks. The rank is asked for the final usage chunk only (``include_usage``);
what the client did not ask for (that chunk, per-chunk usage) is stripped before relaying.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import orjson

from balanceroute.serving.gateway.life import LiveRequest
from balanceroute.serving.gateway.runtime import Drain, forward_headers
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.openai.assemble import Assembler
from balanceroute.serving.openai.sse import DONE, DONE_PAYLOAD, data_payload, token_text

RETRY, FINISHED = "retry", "finished"
ABORT = "abort"  # vLLM's finish_reason for a request the engine stopped (shutdown, abort)
# an event that matters: a set finish_reason, a usage object, the end, an error
MARKERS = re.compile(rb'"finish_reason": ?"|"usage": ?\{|\[DONE\]|"error"')
QUOTED = re.compile(rb'"(?:finish_reason": ?"|usage": ?\{|error")')  # MARKERS but [DONE]


class DeciderPort(Protocol):
    """The decider's methods as the data plane calls them (:class:`~..decider.Decider`, or
    :class:`~.wire.DeciderProxy` in a relay worker)."""

    lost: bool

    def admit(self, tokens: int, key_hash: int, key: str, request_id: str,
              stream: bool) -> tuple[int, asyncio.Future[int]]: ...  # fmt: skip

    def first_token(self, rid: int, t: float) -> None: ...

    def finished(self, rid: int, rank: int, first_t: float, last_t: float, tokens: int,
                 prompt: int, finish_reason: str | None) -> None: ...  # fmt: skip

    def failed(self, rid: int, rank: int, why: str) -> None: ...

    def refused(self, rid: int, rank: int, status: int) -> None: ...

    def requeued(self, rid: int, rank: int, last: bool) -> asyncio.Future[int] | None: ...

    def abandoned(self, rid: int, outcome: str | None) -> None: ...

    def count(self, outcome: str) -> None: ...


class PlaneContext:
    """What a data plane's requests share: the settings, the decider, the upstream key, the
    drain and the clock."""

    def __init__(self, settings: GatewaySettings, decider: DeciderPort,
                 upstream_key: str | None, drain: Drain | None = None) -> None:  # fmt: skip
        self.settings = settings
        self.decider = decider
        self.upstream_key = upstream_key
        # a relay worker's own drain is silent: the decider's process logs the one line
        self.drain = drain or Drain(settings.drain_timeout_s, announce=False)
        self.clock: Callable[[], float] = time.monotonic


class Life:
    """A request's life as calls on the decider, each once (the relay's side of
    :class:`~balanceroute.serving.gateway.life.RequestLife`)."""

    def __init__(self, ctx: PlaneContext, req: LiveRequest, rid: int) -> None:
        self.ctx = ctx
        self.decider = ctx.decider
        self.req = req
        self.rid = rid
        self.done = False
        self.first_sent = False

    @property
    def max_attempts(self) -> int:
        """Ranks the request may be sent to."""
        return self.ctx.settings.max_attempts

    async def admitted(self) -> int:
        """The rank the decider gave (-1: none); :class:`Rejected` when it refused."""
        rank = await self.req.admitted
        self.req.queue_s = self.ctx.clock() - self.req.arrival
        return rank

    def admitted_now(self) -> int | None:
        """The rank if the decider answered already (a request that arrives into a free slot
        is admitted at once), else None: the caller waits with :meth:`admitted`."""
        fut = self.req.admitted
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            return None
        self.req.queue_s = self.ctx.clock() - self.req.arrival
        return fut.result()

    def headers(self, rank: int) -> dict[str, str]:
        """The headers of the request forwarded to ``rank``."""
        return forward_headers(self.ctx.settings, self.ctx.upstream_key, rank, self.req.request_id)

    def rank_failed(self, rank: int, why: str) -> None:
        """``rank`` failed the request before its first token."""
        self.decider.failed(self.rid, rank, why)

    def rank_refused(self, rank: int, status: int) -> None:
        """``rank`` refused the gateway's key (401/403)."""
        self.decider.refused(self.rid, rank, status)

    def requeued(self, rank: int, last: bool) -> bool:
        """Ask the decider to route the request again (False: no more attempts)."""
        fut = self.decider.requeued(self.rid, rank, last)
        if fut is not None:
            self.req.admitted = fut
        return fut is not None

    def progress(self, tokens: int, now: float) -> None:
        """Only the first token is news to the decider."""
        if not self.first_sent and tokens > 0:
            self.first_sent = True
            self.decider.first_token(self.rid, now)

    def finished(self, rank: int, first_t: float, last_t: float, tokens: int, prompt: int,
                 now: float, finish_reason: str | None = None) -> None:  # fmt: skip
        """The rank answered in full: its figures to the decider."""
        self.done = True
        self.decider.finished(self.rid, rank, first_t, last_t, tokens, prompt, finish_reason)

    def abandoned(self, outcome: str | None = None) -> None:
        """The request ended otherwise (``outcome`` counted), once."""
        if self.done:
            if outcome is not None:
                self.count(outcome)
            return
        self.done = True
        self.decider.abandoned(self.rid, outcome)

    def count(self, outcome: str) -> None:
        """An outcome to count."""
        self.decider.count(outcome)

    def leave(self) -> None:
        """However the request ended, it leaves the decider's group once."""
        self.abandoned(None)


class UpstreamBroke(Exception):
    """The rank's stream ended without ``[DONE]``, or carried an error."""


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
        """Output tokens so far: the rank's usage count when it sent one, else token chunks."""
        return self.usage_completion if self.usage_completion >= 0 else self.chunks


def matters(events: bytes) -> bool:
    """Whether ``events`` hold one that matters (:data:`MARKERS`): the same answer for about a
    third of the work per relayed piece (callgrind: 8,900 instructions against 24,400 on a
    228-byte token chunk), as an expression that starts with a literal ``"`` is tried only
    where one is, and ``[DONE]`` is one byte search."""
    return b"[DONE]" in events or QUOTED.search(events) is not None


def rank_body(body: dict[str, Any]) -> bytes:
    """The body sent to the rank: streaming, the final usage chunk (usage in every chunk only
    when the client asked for it)."""
    out = dict(body)
    out["stream"] = True
    options = dict(out.get("stream_options") or {})
    options["include_usage"] = True
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
    choices = obj.get("choices") or []
    if st.first_t is None and any(c.get("finish_reason") == ABORT for c in choices):
        raise UpstreamBroke("the rank aborted the request before its first token")
    _count(obj, choices, st, now)
    usage = obj.get("usage")
    if not req.stream:
        return None
    if not choices and usage is not None:  # the final usage chunk
        return event + b"\n\n" if req.usage else None
    if "usage" in obj and not req.continuous:
        del obj["usage"]
        return b"data: " + orjson.dumps(obj) + b"\n\n"
    return event + b"\n\n"


def _count(obj: dict[str, Any], choices: list[dict[str, Any]], st: Stream, now: float) -> None:
    """Fold a parsed event into ``st``: its tokens, finish reason, usage and model."""
    if st.model is None:
        st.model = obj.get("model")
    if st.whole is not None:
        st.whole.add(obj)
    for choice in choices:
        if token_text(choice) is not None:
            st.chunks += 1
            if st.first_t is None:
                st.first_t = now
            st.last_t = now
        reason = choice.get("finish_reason")
        if reason is not None:
            st.finish_reason = reason
    usage = obj.get("usage")
    if usage:
        st.usage_completion = int(usage.get("completion_tokens") or 0)
        st.usage_prompt = int(usage.get("prompt_tokens") or 0)


def report_finish(life: Any, req: LiveRequest, rank: int, st: Stream, now: float) -> tuple[int, int]:
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

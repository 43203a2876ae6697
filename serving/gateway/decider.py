"""The decider: what the data plane asks of the gateway, as a plain object with typed methods,
and one request's life in the gateway, owned here from arrival to departure.

A request, as its relay reports it: it **arrives** (a position in the pool, or 429), is
**admitted** (the decision loop resolves its future with a rank, or :class:`Rejected`), its
**first token** arrives, it **finished** (metrics, the completion log, its slot leaves the group
with its estimator taught), its rank **failed** it before its first token (or **refused** the
gateway's key), it is **requeued** (back to the head of the pool), or it is **abandoned**
(nothing learned). Each call is applied to the gateway's state
(:class:`~balanceroute.serving.gateway.runtime.Gateway`) on a
:class:`~balanceroute.serving.gateway.clock.ClockedGroup`. The Protocol front calls it directly;
relay workers reach it through a proxy that encodes each call at the socket
(:mod:`.plane.wire`). It starts no process and imports no data plane.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from balanceroute.serving.gateway.clock import ClockedGroup
from balanceroute.serving.gateway.runtime import Gateway

RELAY_LOST = "relay_lost"
BROKEN = "broken"  # a stream that broke after its first token: counted against its rank


class Rejected(Exception):
    """The decider refused the request: ``status`` and ``message`` are the client's answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class LiveRequest:
    """A request as the gateway handles it."""

    request_id: str
    path: str
    chat: bool
    body: dict[str, Any]
    stream: bool
    usage: bool  # the client asked for the final usage chunk
    continuous: bool  # the client asked for usage in every chunk
    prompt_tokens: int
    prompt_key: str
    arrival: float  # monotonic
    arrival_epoch: float
    position: int
    admitted: asyncio.Future[int]  # resolved with the rank by the decision loop
    finished: bool = False
    queue_s: float = 0.0  # arrival to the last forward
    ticket: int = -1  # the live twins' feed
    raw: bytes = b""  # the body as posted


def no_rank(gw: Gateway) -> str:
    """Why no rank is in rotation, as the 503 says it."""
    why = "; ".join(f"rank {g}: {e}" for g, e in sorted(gw.health.last_error.items()))
    return f"no rank is in rotation ({why or 'health checks failing'})"


def arrive(gw: Gateway, request_id: str, tokens: int, key: str, key_hash: int,
           stream: bool) -> LiveRequest:  # fmt: skip
    """Queue a counted request in the pool (a burst that fills it gets a decision at once, and
    so does a lone arrival: :meth:`Dispatcher.arrived`); :class:`Rejected` (429) when there is
    no room."""
    group = gw.group
    if group.pool.size >= gw.settings.max_pool or group.positions_free == 0:
        gw.dispatcher.decide()  # a burst may fill the pool before the loop's next decision
    if group.pool.size >= gw.settings.max_pool or group.positions_free == 0:
        gw.metrics.outcomes.labels("rejected_pool_full").inc()
        raise Rejected(
            429, f"the gateway's pool is full ({group.pool.size} requests waiting); retry later"
        )
    arrival = gw.clock()
    position = group.arrive(tokens, key_hash, arrival)
    assert position is not None  # positions_free was checked above
    req = LiveRequest(
        request_id=request_id, path="", chat=False, body={}, stream=stream, usage=False,
        continuous=False, prompt_tokens=tokens, prompt_key=key, arrival=arrival,
        arrival_epoch=time.time(), position=position, admitted=gw.dispatcher.waiter(position),
        ticket=gw.twins.arrived(arrival, tokens, key_hash),
    )  # fmt: skip
    gw.metrics.accepted.inc()
    gw.dispatcher.arrived(arrival)
    return req


async def admitted(gw: Gateway, req: LiveRequest) -> int:
    """Wait for the decision loop to admit ``req``; its rank. While no rank is in rotation the
    wait is bounded: :class:`Rejected` (503) once the outage has lasted ``no_rank_wait_s`` (the
    request is still queued: the caller abandons it)."""
    health = gw.health
    while not req.admitted.done():
        since = health.outage_since
        if since is None:
            change, timeout = asyncio.ensure_future(health.outage.wait()), None
        else:
            timeout = since + gw.settings.no_rank_wait_s - time.monotonic()
            if timeout <= 0:
                raise Rejected(503, f"{no_rank(gw)}; none came back within "
                               f"{gw.settings.no_rank_wait_s:g} s (--no-rank-wait)")  # fmt: skip
            change = asyncio.ensure_future(health.serving.wait())
        try:
            await asyncio.wait({req.admitted, change}, timeout=timeout,
                               return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
        finally:
            change.cancel()
    return req.admitted.result()


class Decider:
    """Applies a request's life to the gateway (module docstring); ``rid``: the decider's own
    number for a request, from :meth:`admit`."""

    lost = False  # a proxy's line can break; the decider in the process cannot

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.held: dict[int, LiveRequest] = {}
        self.waiting: dict[int, asyncio.Task] = {}  # requests waiting for the decision loop
        self.next_id = 0

    @property
    def group(self) -> ClockedGroup:
        """The live group, aged by the ranks' clocks."""
        return self.gw.group  # type: ignore[return-value]

    def admit(self, tokens: int, key_hash: int, key: str, request_id: str,
              stream: bool) -> tuple[int, asyncio.Future[int]]:  # fmt: skip
        """Queue a counted request: its number, and the future of its rank (:class:`Rejected`
        when the pool is full, no rank is in rotation or the gateway drains)."""
        self.next_id += 1
        rid, gw = self.next_id, self.gw
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        try:
            if gw.drain.draining:
                raise Rejected(503, "the gateway is shutting down")
            if gw.health.outage_since is not None:  # no rank in rotation (``group.healthy``)
                raise Rejected(503, no_rank(gw))
            req = arrive(gw, request_id, tokens, key, key_hash, stream)
        except Rejected as no:
            fut.set_exception(no)
            return rid, fut
        self.held[rid] = req
        self._await_rank(rid, req, fut)
        return rid, fut

    def _await_rank(self, rid: int, req: LiveRequest, fut: asyncio.Future[int]) -> None:
        """Resolve ``fut`` with the request's rank: at once when decided on arrival, else when
        the decision loop admits it (503 once no rank came back within ``no_rank_wait_s``)."""
        now = req.admitted
        if now.done() and not now.cancelled() and now.exception() is None:
            fut.set_result(self._took(req, now.result()))
            return

        async def assign() -> None:
            try:
                rank = self._took(req, await admitted(self.gw, req))
            except Rejected as exc:
                self.held.pop(rid, None)
                self.leave(req, "no_rank")
                if not fut.done():
                    fut.set_exception(exc)
                return
            finally:
                self.waiting.pop(rid, None)
            if not fut.done():
                fut.set_result(rank)

        self.waiting[rid] = asyncio.get_running_loop().create_task(assign())

    def _took(self, req: LiveRequest, rank: int) -> int:
        req.queue_s = self.gw.clock() - req.arrival  # the completion log's (metrics: at the decision)
        return rank

    def first_token(self, rid: int, t: float) -> None:
        """The request's first token reached the relay at monotonic time ``t``."""
        req = self.held.get(rid)
        if req is not None:
            self.group.first_token(req.position, t)

    def finished(self, rid: int, rank: int, first_t: float, last_t: float, tokens: int,
                 prompt: int, finish_reason: str | None) -> None:  # fmt: skip
        """The rank answered in full (``finish_reason`` its last one, never ``abort``): the
        clocks learn, then metrics, the completion log, and the slot leaves the group with its
        estimators taught."""
        req = self.held.pop(rid, None)
        if req is None:
            return
        gw, pos, group = self.gw, req.position, self.group
        if prompt > 0:
            group.correct_prompt(pos, prompt)
        group.finish_seen(pos, first_t, last_t, tokens)
        now = gw.clock()
        gw.switchback.tokens(tokens, now)
        arm = gw.arm_label
        gw.metrics.ttft.labels(arm).observe(first_t - req.arrival)
        if tokens > 1:
            tpot = (last_t - first_t) / (tokens - 1)
            gw.metrics.tpot.labels(arm).observe(tpot)
            gw.switchback.finished(tpot, now)
        gw.metrics.outcomes.labels("completed").inc()
        gw.health.served(rank)
        gw.log.add(req.request_id, req.arrival_epoch, prompt, tokens, req.prompt_key, rank, arm,
                   req.queue_s, time.time(), finish_reason,
                   gw.quality.finish(pos, tokens))  # fmt: skip
        req.finished = True
        gw.twins.finished(req.ticket, tokens, now)
        gw.dispatcher.forget(pos)
        group.leave(pos, tokens, learn=True)
        gw.dispatcher.wake()

    def failed(self, rid: int, rank: int, why: str) -> None:
        """``rank`` failed the request before its first token: out of rotation until it
        recovers."""
        if rid in self.held:
            self.gw.health.suspect(rank, why)

    def refused(self, rid: int, rank: int, status: int) -> None:
        """``rank`` refused the gateway's credentials (401/403): out of rotation until it
        accepts them (passive health: it would look empty and attract everything)."""
        if rid in self.held:
            why = (f"answered {status} to a forwarded request: the rank refuses the gateway's "
                   "credentials (check BALANCEROUTE_UPSTREAM_API_KEY)")  # fmt: skip
            self.gw.health.refused_credentials(rank, why)

    def requeued(self, rid: int, rank: int, last: bool) -> asyncio.Future[int] | None:
        """After a failed attempt on ``rank``: back to the head of the pool, the future of its
        next rank (-1: no room); None after the ``last`` attempt."""
        req = self.held.get(rid)
        if req is None:
            return None
        gw = self.gw
        gw.metrics.reroutes.labels(str(rank)).inc()
        if last:
            return None
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        new = gw.group.requeue(req.position)
        if new is None:
            fut.set_result(-1)
            return fut
        gw.dispatcher.forget(req.position)
        req.position = new
        req.admitted = gw.dispatcher.waiter(new)
        gw.dispatcher.wake()
        self._await_rank(rid, req, fut)
        return fut

    def abandoned(self, rid: int, outcome: str | None) -> None:
        """The request ended otherwise: it leaves the pool or its rank once (``outcome``
        counted when given)."""
        req = self.held.pop(rid, None)
        if req is None:
            return
        task = self.waiting.pop(rid, None)
        if task is not None:
            task.cancel()
        rank = int(self.group.rank[req.position]) if not req.finished else -1
        self.leave(req, outcome)
        if outcome == BROKEN and rank >= 0:  # passive health: /health cannot see this
            self.gw.health.broke(rank)

    def leave(self, req: LiveRequest, outcome: str | None = None) -> None:
        """``req``'s position leaves the pool or its rank, once (nothing learned);
        ``outcome`` is counted."""
        gw, group = self.gw, self.group
        if not req.finished:
            req.finished = True
            gw.twins.dropped(req.ticket)
            gw.dispatcher.forget(req.position)
            if req.position in group.pool.order:
                group.abandon(req.position)
            elif group.rank[req.position] >= 0:
                group.leave(req.position, int(group.age[req.position]), learn=False)
                gw.dispatcher.wake()
        if outcome is not None:
            self.count(outcome)

    def count(self, outcome: str) -> None:
        """An outcome to count, nothing else."""
        self.gw.metrics.outcomes.labels(outcome).inc()

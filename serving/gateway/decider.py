"""The decider: what the data plane asks of the gateway, as a plain object with typed methods.

A request's life, as the relay that moves its bytes reports it: it is **admitted** (queued in
the pool; the answer is a future resolved with its rank, or :class:`Rejected`), its **first
token** arrives, it **finished** on its rank, the rank **failed** it before its first token (or
**refused** the gateway's key), it is **requeued** after a failed attempt, or it is
**abandoned** (client gone, ranks failed, relay lost). Each call is applied to the gateway's
state (:class:`~balanceroute.serving.gateway.runtime.Gateway`: the pool, the policies, the
switchback, the completion log, rank health, the metrics) through the same
:class:`~balanceroute.serving.gateway.life.RequestLife` every request has, on a
:class:`~balanceroute.serving.gateway.clock.ClockedGroup` that ages the running requests from
their ranks' iteration clocks (first tokens and finishes are all it hears).

The Protocol front calls it directly; relay worker processes reach the same methods through a
proxy that encodes each call at the socket (:mod:`.plane.wire`). It starts no process and
imports no data plane.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import SimpleNamespace

from balanceroute.serving.gateway.clock import ClockedGroup
from balanceroute.serving.gateway.life import (
    LiveRequest,
    NoRankInRotation,
    PoolFull,
    RequestLife,
    arrive,
)
from balanceroute.serving.gateway.runtime import Gateway

RELAY_LOST = "relay_lost"


class Rejected(Exception):
    """The decider refused the request: ``status`` and ``message`` are the client's answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Held:
    """One admitted request, as the decider holds it."""

    req: LiveRequest
    life: RequestLife
    waiting: asyncio.Task | None = None


class Decider:
    """Applies a request's life to the gateway (module docstring); ``rid``: the decider's own
    number for a request, from :meth:`admit`."""

    lost = False  # a proxy's line can break; the decider in the process cannot

    def __init__(self, gw: Gateway) -> None:
        self.gw = gw
        self.held: dict[int, Held] = {}
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
        if gw.drain.draining:
            fut.set_exception(Rejected(503, "the gateway is shutting down"))
            return rid, fut
        if not gw.group.healthy.any():
            why = "; ".join(f"rank {g}: {e}" for g, e in sorted(gw.health.last_error.items()))
            fut.set_exception(Rejected(503, f"no rank is in rotation ({why or 'health checks failing'})"))
            return rid, fut
        checked = SimpleNamespace(stream=stream, stream_options=None)
        try:
            req = arrive(gw, request_id=request_id, path="", chat=False, body={}, checked=checked,
                         tokens=tokens, key=key, key_hash=key_hash)  # fmt: skip
        except PoolFull as full:
            fut.set_exception(Rejected(429, str(full)))
            return rid, fut
        held = Held(req, RequestLife(gw, req))
        self.held[rid] = held
        self._await_rank(rid, held, fut)
        return rid, fut

    def _await_rank(self, rid: int, held: Held, fut: asyncio.Future[int]) -> None:
        """Resolve ``fut`` with the request's rank: at once when decided on arrival, else when
        the decision loop admits it (503 once no rank came back within ``no_rank_wait_s``)."""
        rank = held.life.admitted_now()
        if rank is not None:
            fut.set_result(rank)
            return

        async def assign() -> None:
            try:
                rank = await held.life.admitted()
            except NoRankInRotation as exc:
                held.waiting = None
                self.held.pop(rid, None)
                held.life.abandoned("no_rank")
                if not fut.done():
                    fut.set_exception(Rejected(503, str(exc)))
                return
            held.waiting = None
            if not fut.done():
                fut.set_result(rank)

        held.waiting = asyncio.get_running_loop().create_task(assign())

    def first_token(self, rid: int, t: float) -> None:
        """The request's first token reached the relay at monotonic time ``t``."""
        held = self.held.get(rid)
        if held is not None:
            self.group.first_token(held.req.position, t)

    def finished(self, rid: int, rank: int, first_t: float, last_t: float, tokens: int,
                 prompt: int, finish_reason: str | None) -> None:  # fmt: skip
        """The rank answered in full: the clocks learn, the request leaves with its figures."""
        held = self.held.pop(rid, None)
        if held is None:
            return
        pos, group = held.req.position, self.group
        if prompt > 0:
            group.correct_prompt(pos, prompt)
        group.finish_seen(pos, first_t, last_t, tokens)
        now = self.gw.clock()
        self.gw.switchback.tokens(tokens, now)
        held.life.finished(rank, first_t, last_t, tokens, prompt, now, finish_reason)

    def failed(self, rid: int, rank: int, why: str) -> None:
        """``rank`` failed the request before its first token: out of rotation."""
        held = self.held.get(rid)
        if held is not None:
            held.life.rank_failed(rank, why)

    def refused(self, rid: int, rank: int, status: int) -> None:
        """``rank`` refused the gateway's credentials (401/403)."""
        held = self.held.get(rid)
        if held is not None:
            held.life.rank_refused(rank, status)

    def requeued(self, rid: int, rank: int, last: bool) -> asyncio.Future[int] | None:
        """After a failed attempt on ``rank``: back to the head of the pool, the future of its
        next rank (-1: no room); None after the ``last`` attempt."""
        held = self.held.get(rid)
        if held is None:
            return None
        again = held.life.requeued(rank, last)
        if last:
            return None
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if again:
            self._await_rank(rid, held, fut)
        else:
            fut.set_result(-1)
        return fut

    def abandoned(self, rid: int, outcome: str | None) -> None:
        """The request ended otherwise: it leaves the pool or its rank once (``outcome``
        counted when given)."""
        held = self.held.pop(rid, None)
        if held is None:
            return
        if held.waiting is not None:
            held.waiting.cancel()
        held.life.abandoned(outcome)

    def count(self, outcome: str) -> None:
        """An outcome to count, nothing else."""
        self.gw.metrics.outcomes.labels(outcome).inc()

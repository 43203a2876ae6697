"""One request's life in the gateway, owned here from arrival to departure: it **arrives** (a
position in the pool, or a full pool), is **admitted** (the decision loop resolves its future
with a rank), and either **finishes** (metrics, the completion log, its slot leaves
the group with its estimator taught) or is **abandoned** (client gone, ranks failed: it leaves
the pool or its rank once, nothing learned). A rank that fails before the first token sends it
back to the head of the pool (**requeued**).

The data plane only moves bytes and reports through the decider (:mod:`.decider`); every change
to the group, the dispatcher, the switchback, the health checks, the metrics and the log goes
through here.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from dataclasses import dataclass
from typing import Any

from balanceroute.serving.gateway.runtime import Gateway


class PoolFull(Exception):
    """No room in the gateway's pool: the request is refused (429)."""


class NoRankInRotation(Exception):
    """No rank was in rotation for ``no_rank_wait_s`` while the request waited (503)."""


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


def arrive(
    gw: Gateway,
    *,
    request_id: str | None,
    path: str,
    chat: bool,
    body: dict[str, Any],
    checked: Any,
    tokens: int,
    key: str,
    key_hash: int,
) -> LiveRequest:
    """Queue a counted request in the pool (a burst that fills it gets a decision at once, and
    so does a lone arrival: :meth:`Dispatcher.arrived`); :class:`PoolFull` when there is no
    room."""
    group = gw.group
    if group.pool.size >= gw.settings.max_pool or group.positions_free == 0:
        gw.dispatcher.decide()  # a burst may fill the pool before the loop's next decision
    if group.pool.size >= gw.settings.max_pool or group.positions_free == 0:
        gw.metrics.outcomes.labels("rejected_pool_full").inc()
        raise PoolFull(
            f"the gateway's pool is full ({group.pool.size} requests waiting); retry later"
        )
    position = group.arrive(tokens, key_hash, gw.clock())
    assert position is not None  # positions_free was checked above
    options = checked.stream_options
    req = LiveRequest(
        request_id=request_id or f"gw-{uuid.uuid4().hex[:16]}",
        path=path,
        chat=chat,
        body=body,
        stream=checked.stream,
        usage=bool(options and options.include_usage),
        continuous=bool(options and options.continuous_usage_stats),
        prompt_tokens=tokens,
        prompt_key=key,
        arrival=float(group.arrival_s[position]),
        arrival_epoch=time.time(),
        position=position,
        admitted=gw.dispatcher.waiter(position),
        ticket=gw.twins.arrived(float(group.arrival_s[position]), tokens, key_hash),
    )
    gw.metrics.outcomes.labels("accepted").inc()
    gw.dispatcher.arrived()
    return req


class RequestLife:
    """The life of one queued request (module docstring): what the relay reports, applied to
    the gateway's state."""

    def __init__(self, gw: Gateway, req: LiveRequest) -> None:
        self.gw = gw
        self.req = req

    async def admitted(self) -> int:
        """Wait for the decision loop to admit the request; its rank. While no rank is in
        rotation the wait is bounded: :class:`NoRankInRotation` once the outage has lasted
        ``no_rank_wait_s`` (the request is still queued: the caller abandons it)."""
        gw, req = self.gw, self.req
        health = gw.health
        while not req.admitted.done():
            since = health.outage_since
            if since is None:
                change, timeout = asyncio.ensure_future(health.outage.wait()), None
            else:
                timeout = since + gw.settings.no_rank_wait_s - time.monotonic()
                if timeout <= 0:
                    why = "; ".join(f"rank {g}: {e}" for g, e in sorted(health.last_error.items()))
                    raise NoRankInRotation(
                        f"no rank is in rotation ({why or 'health checks failing'}); none came "
                        f"back within {gw.settings.no_rank_wait_s:g} s (--no-rank-wait)"
                    )
                change = asyncio.ensure_future(health.serving.wait())
            try:
                await asyncio.wait({req.admitted, change}, timeout=timeout,
                                   return_when=asyncio.FIRST_COMPLETED)  # fmt: skip
            finally:
                change.cancel()
        return self._took(req.admitted.result())

    def admitted_now(self) -> int | None:
        """The rank if the request was admitted already (an arrival into an idle group is
        decided at once), else None: the caller waits with :meth:`admitted`."""
        fut = self.req.admitted
        if not fut.done() or fut.cancelled() or fut.exception() is not None:
            return None
        return self._took(fut.result())

    def _took(self, rank: int) -> int:
        gw, req = self.gw, self.req
        now = gw.clock()
        wait = req.queue_s = now - req.arrival
        gw.metrics.wait.labels(gw.arm_label).observe(wait)
        gw.switchback.admitted(wait, now)
        return rank

    def rank_failed(self, rank: int, why: str) -> None:
        """``rank`` failed the request before it started: out of rotation until it recovers."""
        self.gw.health.suspect(rank, why)

    def rank_refused(self, rank: int, status: int) -> None:
        """``rank`` refused the gateway's credentials (401/403): out of rotation until it
        accepts them (passive health: it would look empty and attract everything)."""
        why = (f"answered {status} to a forwarded request: the rank refuses the gateway's "
               "credentials (check BALANCEROUTE_UPSTREAM_API_KEY)")  # fmt: skip
        self.gw.health.refused_credentials(rank, why)

    def requeued(self, rank: int, last: bool) -> bool:
        """After a failed attempt on ``rank``: back to the head of the pool (False: no more
        attempts, or no room)."""
        gw, req = self.gw, self.req
        gw.metrics.reroutes.labels(str(rank)).inc()
        if last:
            return False
        new = gw.group.requeue(req.position)
        if new is None:
            return False
        gw.dispatcher.forget(req.position)
        req.position = new
        req.admitted = gw.dispatcher.waiter(new)
        gw.dispatcher.wake()
        return True

    def finished(
        self,
        rank: int,
        first_t: float,
        last_t: float,
        tokens: int,
        prompt: int,
        now: float,
        finish_reason: str | None = None,
    ) -> None:
        """The rank answered in full (``finish_reason`` its last one, never ``abort``): metrics,
        the completion log, and the slot leaves the group with its estimators taught."""
        gw, req = self.gw, self.req
        ttft = first_t - req.arrival
        tpot = (last_t - first_t) / (tokens - 1) if tokens > 1 else None
        arm = gw.arm_label
        gw.metrics.ttft.labels(arm).observe(ttft)
        if tpot is not None:
            gw.metrics.tpot.labels(arm).observe(tpot)
            gw.switchback.finished(tpot, now)
        gw.metrics.outcomes.labels("completed").inc()
        gw.log.add(req.request_id, req.arrival_epoch, prompt, tokens, req.prompt_key, rank, arm,
                   req.queue_s, time.time(), finish_reason,
                   gw.quality.finish(req.position, tokens))  # fmt: skip
        req.finished = True
        gw.twins.finished(req.ticket, tokens, now)
        gw.dispatcher.forget(req.position)
        gw.group.leave(req.position, tokens, learn=True)
        gw.dispatcher.wake()

    def abandoned(self, outcome: str | None = None) -> None:
        """However the request ended otherwise, its position leaves the pool or its rank once
        (nothing learned); ``outcome`` is counted."""
        self.leave()
        if outcome is not None:
            self.count(outcome)

    def count(self, outcome: str) -> None:
        self.gw.metrics.outcomes.labels(outcome).inc()

    def leave(self) -> None:
        """The position leaves the pool or its rank, once."""
        req, gw = self.req, self.gw
        if req.finished:
            return
        req.finished = True
        gw.twins.dropped(req.ticket)
        gw.dispatcher.forget(req.position)
        group = gw.group
        if req.position in group.pool.order:
            group.abandon(req.position)
        elif group.rank[req.position] >= 0:
            group.leave(req.position, int(group.age[req.position]), learn=False)
            gw.dispatcher.wake()

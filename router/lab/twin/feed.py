"""What a live twin is fed: a program's requests, numbered in arrival order once they finished.

A service or a gateway tells its feed when a request arrives, finishes (with its output length)
or is dropped (aborted, errored, abandoned: never replayed, its output length is not one). The
routing side only appends to a deque (:class:`TwinFeed`, no lock, no wait); the twin's worker
thread turns the events into :class:`~balanceroute.router.lab.twin.config.Finished` rows
(:class:`ArrivalOrder`): a request gets the next arrival number once every request that
arrived before it has finished or been dropped, so the numbers are dense, in arrival order, and
a block (consecutive numbers) holds finished requests only. Memory is bounded: at most
``max_pending`` requests wait for a number; beyond that the oldest unresolved one is given up
(counted; a later finish of it is ignored).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.router.lab.twin.config import Finished

ARRIVE, FINISH, DROP = 0, 1, 2


@dataclass(slots=True)
class _Pending:
    release_s: float
    prompt_tokens: int
    prompt_key: int
    output_tokens: int = 0
    finish_s: float = 0.0
    state: int = ARRIVE


class ArrivalOrder:
    """Requests by arrival ticket until they are numbered (finished) or dropped."""

    def __init__(self, max_pending: int) -> None:
        if max_pending < 1:
            raise ValueError(f"max_pending must be >= 1, got {max_pending}")
        self.max_pending = max_pending
        self.pending: dict[int, _Pending] = {}
        self.head = 0  # the oldest ticket not yet resolved
        self.numbered = 0  # arrival numbers given so far
        self.dropped = 0
        self.given_up = 0  # unresolved requests dropped to bound memory
        self.late = 0  # finishes of tickets given up or never seen

    def apply(self, kind: int, ticket: int, a: float, b: float, c: int) -> None:
        """One event: ``ARRIVE (release_s, prompt_tokens, prompt_key)``, ``FINISH
        (output_tokens, finish_s, -)`` or ``DROP``."""
        if kind == ARRIVE:
            if ticket < self.head:  # arrived before this order started (a new twins' process)
                self.late += 1
                return
            self.pending[ticket] = _Pending(a, int(b), c)
            return
        p = self.pending.get(ticket)
        if p is None or p.state != ARRIVE:
            self.late += 1
            return
        if kind == FINISH:
            p.output_tokens, p.finish_s, p.state = max(1, int(a)), float(b), FINISH
        else:
            p.state = DROP

    def take(self) -> Finished | None:
        """The newly numbered requests (the resolved prefix in arrival order), or None."""
        rows: list[tuple[int, _Pending]] = []
        pending = self.pending  # tickets are dense: the keys are head, head + 1, ...
        while pending:
            p = pending[self.head]
            if p.state == ARRIVE:
                if len(pending) <= self.max_pending:
                    break
                self.given_up += 1
            elif p.state == FINISH:
                rows.append((self.numbered, p))
                self.numbered += 1
            else:
                self.dropped += 1
            del pending[self.head]
            self.head += 1
        if not rows:
            return None
        n = len(rows)
        return Finished(
            index=np.fromiter((i for i, _ in rows), dtype=np.int64, count=n),
            release_s=np.fromiter((p.release_s for _, p in rows), dtype=np.float64, count=n),
            prompt_tokens=np.fromiter((p.prompt_tokens for _, p in rows), np.int64, count=n),
            prompt_key=np.fromiter((p.prompt_key for _, p in rows), dtype=np.uint64, count=n),
            trace_index=np.fromiter((i for i, _ in rows), dtype=np.int64, count=n),
            output_tokens=np.fromiter((p.output_tokens for _, p in rows), np.int64, count=n),
            finish_s=np.fromiter((p.finish_s for _, p in rows), dtype=np.float64, count=n),
        )

    def stats(self) -> dict[str, Any]:
        """What the feed did, for a status page."""
        return {
            "twin_requests_numbered": self.numbered,
            "twin_requests_waiting": len(self.pending),
            "twin_requests_dropped": self.dropped,
            "twin_requests_given_up": self.given_up,
        }


class TwinFeed:
    """The routing side's half: events appended to a deque (thread-safe, never waits) and the
    live iteration counter that sets the twin's budget."""

    def __init__(self) -> None:
        self.events: deque[tuple[int, int, float, float, int]] = deque()
        self.tickets = 0
        self.iteration = 0

    def arrived(self, release_s: float, prompt_tokens: int, prompt_key: int) -> int:
        """A request arrived; its ticket (call from one thread: the routing side)."""
        t = self.tickets
        self.tickets += 1
        self.events.append((ARRIVE, t, float(release_s), float(prompt_tokens), int(prompt_key)))
        return t

    def finished(self, ticket: int, output_tokens: int, finish_s: float) -> None:
        """The request of ``ticket`` finished with ``output_tokens``."""
        self.events.append((FINISH, ticket, float(output_tokens), float(finish_s), 0))

    def dropped(self, ticket: int) -> None:
        """The request of ``ticket`` left without a whole output: never replayed."""
        self.events.append((DROP, ticket, 0.0, 0.0, 0))

    def tick(self, iteration: int) -> None:
        """The group's live iteration now (the budget counts its advance)."""
        self.iteration = int(iteration)

    def drain(self, order: ArrivalOrder) -> Finished | None:
        """Apply every event so far to ``order`` (the worker's side); the new rows."""
        events = self.events
        while events:
            order.apply(*events.popleft())
        return order.take()

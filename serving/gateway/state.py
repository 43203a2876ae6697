"""The live state of the decode group as the gateway sees it, in the router's own types.

A policy sizes its per-run arrays by the :class:`~balanceroute.router.policies.state.RequestTable`,
so the live table has a fixed capacity (the pool limit, every slot of the group, a margin) and
its *positions are recycled*: taken when a request arrives, given back once the policy's
``on_complete`` was told it left (or it left the pool without running). Per position: prompt
tokens and key (in the table), its rank, its age (tokens streamed), its arrival, and how often
later requests were admitted before it.

The pool, oldest first, is the router's :class:`~balanceroute.router.policies.state.Pool`; a
request sent back by a failed rank goes to its head. ``iteration`` estimates the engine's step
counter (one more at a decision when tokens arrived since the last; only its differences matter
to the policies: docs/design.md, "The gateway").
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import islice

import numpy as np

from balanceroute.router.policies.state import RequestTable, RouterState, RunningRequests

MARGIN = 64


class LivePool:
    """Waiting positions in arrival order (a re-routed request goes back to the head)."""

    def __init__(self, group: LiveGroup) -> None:
        self.group = group
        self.order: dict[int, None] = {}

    @property
    def size(self) -> int:
        return len(self.order)

    def push(self, position: int) -> None:
        self.order[position] = None

    def push_front(self, position: int) -> None:
        self.order = {position: None, **self.order}

    def remove(self, position: int) -> bool:
        """Take ``position`` out of the pool; False if it was not waiting."""
        return self.order.pop(position, 0) is None

    def head(self, n: int) -> np.ndarray:
        return np.fromiter(islice(self.order, max(0, n)), dtype=np.int64)

    def waited_iterations(self, positions: np.ndarray) -> np.ndarray:
        return self.group.iteration - self.group.release_iter[positions]

    def waited_seconds(self, positions: np.ndarray) -> np.ndarray:
        return self.group.now - self.group.arrival_s[positions]

    def overtaken(self, positions: np.ndarray) -> np.ndarray:
        return self.group.overtaken[positions]

    def passed(self, admitted: Iterable[int]) -> None:
        """Count, for every request still waiting, the later requests admitted before it."""
        later = set(admitted)
        if not later:
            return
        over = self.group.overtaken
        for p in self.order:
            if not later:
                return
            later.discard(p)
            over[p] += len(later)


@dataclass(slots=True)
class Departure:
    """A request that left a rank: its position, tokens and whether the estimators learn it."""

    position: int
    output_tokens: int
    learn: bool


@dataclass
class LiveGroup:
    """G ranks of B slots, the recycled request table and the pool."""

    ranks: int
    slots: int
    capacity: int
    now: float = 0.0
    iteration: int = 0
    tokens_seen: int = 0
    departures: list[Departure] = field(default_factory=list)

    def __post_init__(self) -> None:
        n = self.capacity
        self.table = RequestTable(
            prompt_tokens=np.ones(n, dtype=np.int64),
            prompt_key=np.zeros(n, dtype=np.uint64),
            trace_index=np.arange(n, dtype=np.int64),
        )
        self.rank = np.full(n, -1, dtype=np.int64)
        self.age = np.zeros(n, dtype=np.int64)
        self.arrival_s = np.zeros(n, dtype=np.float64)
        self.release_iter = np.zeros(n, dtype=np.int64)
        self.overtaken = np.zeros(n, dtype=np.int64)
        self.inflight = np.zeros(self.ranks, dtype=np.int64)
        self.running_total = 0  # ``inflight.sum()`` kept as a Python int: read at every arrival
        self.healthy = np.ones(self.ranks, dtype=bool)
        self.out_of_rotation = 0  # ranks not ``healthy`` (:meth:`set_healthy`)
        self.heard = np.zeros(self.ranks, dtype=np.int64)  # tokens or finishes heard per rank
        self.pool = LivePool(self)
        self._free = list(range(n - 1, -1, -1))
        self._tokens_at_decision = 0

    @classmethod
    def sized(cls, ranks: int, slots: int, max_pool: int) -> LiveGroup:
        """A group whose table holds a full pool, every slot, and a margin for departures
        waiting for their ``on_complete``."""
        return cls(ranks, slots, max_pool + ranks * slots + MARGIN)

    # ---- positions ------------------------------------------------------------------------
    @property
    def positions_free(self) -> int:
        return len(self._free)

    def arrive(self, prompt_tokens: int, prompt_key: int, now: float) -> int | None:
        """A new request joins the tail of the pool; its position, or None when the table is
        full (every position waiting, running or not yet released by ``on_complete``)."""
        if not self._free:
            return None
        p = self._free.pop()
        self.table.prompt_tokens[p] = prompt_tokens
        self.table.prompt_key[p] = prompt_key
        self.rank[p] = -1
        self.age[p] = 0
        self.arrival_s[p] = now
        self.release_iter[p] = self.iteration
        self.overtaken[p] = 0
        self.pool.push(p)
        return p

    def requeue(self, old: int) -> int | None:
        """A request whose rank failed before its first token: a fresh position at the head of
        the pool (the old one leaves the policy through ``on_complete``, unlearned); None when
        no position is free."""
        if not self._free:
            return None
        p = self._free.pop()
        for column in (self.table.prompt_tokens, self.table.prompt_key):
            column[p] = column[old]
        for column in (self.arrival_s, self.release_iter, self.overtaken):
            column[p] = column[old]
        self.leave(old, 1, learn=False)
        self.rank[p] = -1
        self.age[p] = 0
        self.pool.push_front(p)
        return p

    def abandon(self, position: int) -> None:
        """A waiting request whose client went away: it never ran, its position is free."""
        if self.pool.remove(position):
            self._free.append(position)

    # ---- running requests -----------------------------------------------------------------
    def start(self, position: int, rank: int) -> None:
        """An admission: ``position`` now runs on ``rank``."""
        self.pool.remove(position)
        self.rank[position] = rank
        self.age[position] = 0
        self.inflight[rank] += 1
        self.running_total += 1

    def advance(self, position: int, tokens: int) -> None:
        """``position`` has now streamed ``tokens`` tokens."""
        grew = tokens - int(self.age[position])
        if grew > 0:
            self.age[position] = tokens
            self.tokens_seen += grew
            g = self.rank[position]
            if g >= 0:
                self.heard[g] += 1

    def correct_prompt(self, position: int, prompt_tokens: int) -> None:
        """The rank's own prompt count (``usage.prompt_tokens``) replaces the estimate."""
        if prompt_tokens >= 1:
            self.table.prompt_tokens[position] = prompt_tokens

    def leave(self, position: int, output_tokens: int, *, learn: bool) -> None:
        """``position`` left its rank; it is handed to the policy's ``on_complete`` at the next
        decision and freed after that."""
        g = int(self.rank[position])
        if g >= 0:
            self.inflight[g] -= 1
            self.running_total -= 1
            self.rank[position] = -1
        self.departures.append(Departure(position, max(1, int(output_tokens)), learn))

    def take_departures(self) -> list[Departure]:
        """Departures not yet told to the policy (free them with :meth:`release` once
        ``on_complete`` has run)."""
        out, self.departures = self.departures, []
        return out

    def release(self, departures: Iterable[Departure]) -> None:
        """Free the positions of departures the policy has been told about."""
        self._free.extend(d.position for d in departures)

    # ---- the router's view ----------------------------------------------------------------
    def running_positions(self) -> np.ndarray:
        return (self.rank >= 0).nonzero()[0]

    def loads(self, now: float | None = None) -> np.ndarray:
        """KV tokens per rank: prompt plus streamed tokens of its running requests."""
        pos = self.running_positions()
        work = self.table.prompt_tokens[pos] + self.age[pos]
        return np.bincount(self.rank[pos], weights=work, minlength=self.ranks)

    def set_healthy(self, rank: int, ok: bool) -> None:
        """``rank`` is in rotation (``ok``) or out of it."""
        if bool(self.healthy[rank]) != ok:
            self.healthy[rank] = ok
            self.out_of_rotation += -1 if ok else 1

    def free_slots(self) -> np.ndarray:
        """Free slots per rank; a rank out of rotation has none (a rank never runs more than
        its slots: every admission is checked)."""
        free = self.slots - self.inflight
        if self.out_of_rotation:
            free *= self.healthy
        return free

    def has_free_slot(self) -> bool:
        """Whether any rank in rotation has a free slot (all in rotation: fewer requests run
        than the group has slots, as no rank runs more than its slots)."""
        if not self.out_of_rotation:
            return self.running_total < self.ranks * self.slots
        return bool(((self.inflight < self.slots) & self.healthy).any())

    def running(self) -> RunningRequests:
        pos = self.running_positions()
        age = self.age[pos]
        prompts = self.table.prompt_tokens[pos]
        return RunningRequests(
            position=pos,
            worker=self.rank[pos],
            workload=prompts + age,
            age=age,
            prompt_tokens=prompts,
        )

    def pulse(self, now: float) -> int:
        """The step estimate at ``now``: one more if tokens arrived since the last pulse; the
        iteration."""
        self.now = now
        if self.tokens_seen != self._tokens_at_decision:
            self._tokens_at_decision = self.tokens_seen
            self.iteration += 1
        return self.iteration

    def next_step(self, after: float) -> float | None:
        """When the tokens of the first engine step ending after ``after`` should arrive; None:
        not known here (ages from chunks keep no step phase; :class:`~.split.clock.ClockedGroup`
        does)."""
        return None

    def step_period(self) -> float:
        """The group's step period where its phase is known (here never: inf)."""
        return float("inf")

    def watch_step(self, on_early: Callable[[float], None]) -> None:
        """Where the step's phase is known, tell ``on_early`` how early each step's tokens came
        (here none is known)."""

    def needs_tick(self) -> bool:
        """Whether the step estimate needs a pulse every tick now: requests run (their tokens
        advance it one tick at a time)."""
        return bool(self.inflight.any())

    def snapshot(self, now: float) -> RouterState:
        """The router's state now (advancing the step estimate if tokens arrived)."""
        self.pulse(now)
        return RouterState(
            iteration=self.iteration,
            time_s=now,
            free_slots=self.free_slots(),
            active=self.inflight.copy(),
            pool=self.pool,
            requests=self.table,
            running_source=self.running,
            loads_source=lambda: self.loads(now),
            free_total=-1 if self.out_of_rotation else self.slots * self.ranks - self.running_total,
        )

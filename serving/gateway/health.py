"""Rank health: ``GET /health`` of every rank on an interval; a rank that fails
``health_fall`` checks in a row (3) leaves the rotation (no free slots, so no admissions) and
comes back after ``health_rise`` good answers in a row (2), so one slow or missed probe (an
overloaded engine) never takes a rank, or every rank, out.

A rank in rotation that streamed a token or finished a request since the last round, or whose
engine's step counter moved (:class:`~.split.clock.EngineCounters`; the group's ``heard``
count), is serving: it is not probed that round, so a busy group costs no checks; a rank that is
quiet, suspect, out or refusing the key is.

A forwarding failure marks its rank suspect at once and checks it without waiting for the next
round. ``health_fall`` streams in a row that broke after their first token (reset, cut short,
past the chunk deadline, not valid SSE: :meth:`RankHealth.broke`) eject a rank as Envoy's outlier
detection does: ``/health`` cannot vouch for streams (a rank can answer it and break every
stream), so the rank stays out for :data:`EJECT_S` times 2 to the number of its earlier
ejections (at most :data:`EJECT_MAX_S`) whatever its checks say, then comes back on probation
(after ``health_rise`` good checks): its next broken stream ejects it again, and a stream it
finishes in full clears its record. A rank that refused the gateway's credentials (401/403: a wrong
``BALANCEROUTE_UPSTREAM_API_KEY``) looks healthy to ``/health``, which vLLM does not guard, so it
is checked with ``GET /v1/models`` and the key instead, and stays out, named so in ``/readyz``
and the log, until it accepts them. In header mode the ranks share one upstream: its health is
theirs. Checks go over the ranks' kept-alive connections (``fetch``: the gateway's
:meth:`~.upstream.RankPool.get`).

A check that timed out more than :data:`LATE_LOOP_S` after its deadline timed out because the
gateway's own event loop was late (a stall of the process, or of the machine: the answer may have
been waiting in the socket), not because the rank was: it is not counted either way
(``unjudged``), so a stalled gateway does not empty its rotation when it wakes.

An **outage** (no rank in rotation) is tracked: :attr:`RankHealth.outage_since` and two events,
``outage`` and ``serving``, which the queued requests wait on (they get 503 after
``no_rank_wait_s`` of outage, :func:`~balanceroute.serving.gateway.decider.admitted`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup

log = logging.getLogger("balanceroute.gateway")
# GET of a rank's path: (rank, path, headers, timeout_s) -> (status, body)
Fetch = Callable[[int, str, dict[str, str], float], Awaitable[tuple[int, bytes]]]
CHECK_TIMEOUT_S = 2.0
LATE_LOOP_S = 0.25  # a timeout that fired this late past its deadline says the loop stalled
EJECT_S, EJECT_MAX_S = 10.0, 300.0  # a rank breaking streams stays out this long, doubling


class RankHealth:
    """Health checks of every rank; ``group.healthy`` is what admissions see."""

    def __init__(
        self,
        settings: GatewaySettings,
        group: LiveGroup,
        metrics: GatewayMetrics,
        on_recover: Callable[[], None],
        fetch: Fetch,
    ) -> None:
        self.settings = settings
        self.group = group
        self.metrics = metrics
        self.on_recover = on_recover
        self.fetch = fetch
        self._poke = asyncio.Event()
        self.last_error: dict[int, str] = {}
        self.refused: dict[int, str] = {}  # ranks that refused the credentials, and why
        self.auth_headers: Callable[[int], dict[str, Any]] = lambda rank: {}
        self.fails = [0] * group.ranks  # failed checks in a row
        self.heard_then = group.heard.copy()  # the group's ``heard`` at the last round
        self.skipped = 0  # checks not made: the rank was serving
        self.unjudged = 0  # checks that timed out while the gateway's own loop was late
        self.passes = [0] * group.ranks  # good checks in a row
        self.breaks = [0] * group.ranks  # streams broken after their first token, in a row
        self.ejections = [0] * group.ranks  # times ejected for broken streams, since a good one
        self.ejected_until = [0.0] * group.ranks  # monotonic time an ejection ends
        for g in range(group.ranks):
            metrics.healthy.labels(str(g)).set(1)
        self.outage_since: float | None = None  # monotonic time the last rank left the rotation
        self.outage = asyncio.Event()  # set while no rank is in rotation
        self.serving = asyncio.Event()  # set while one is
        self.serving.set()

    def _ranks_of(self, rank: int) -> range | list[int]:
        return range(self.group.ranks) if self.settings.rank_header is not None else [rank]

    def _set(self, rank: int, ok: bool, why: str = "") -> None:
        for g in self._ranks_of(rank):
            was = bool(self.group.healthy[g])
            self.group.set_healthy(g, ok)
            self.metrics.healthy.labels(str(g)).set(int(ok))
            if ok and not was:
                log.warning("rank %d is healthy again: back in rotation", g)
                self.last_error.pop(g, None)
                self.on_recover()
            elif not ok and was:
                log.warning("rank %d left the rotation: %s", g, why)
                self.last_error[g] = why
        self._track_outage()

    def _track_outage(self) -> None:
        """Start or end an outage (no rank in rotation) as the ranks' health says."""
        out = not self.group.healthy.any()
        if out and self.outage_since is None:
            self.outage_since = time.monotonic()
            self.serving.clear()
            self.outage.set()
            log.warning("no rank is in rotation: queued requests get 503 after %g s unless one "
                        "comes back (--no-rank-wait)", self.settings.no_rank_wait_s)  # fmt: skip
        elif not out and self.outage_since is not None:
            self.outage_since = None
            self.outage.clear()
            self.serving.set()

    def _probed(self, rank: int, ok: bool, why: str) -> None:
        """One check's result, applied with hysteresis (module docstring)."""
        in_rotation = bool(self.group.healthy[rank])
        if ok:
            self.fails[rank], self.passes[rank] = 0, self.passes[rank] + 1
            if time.monotonic() < self.ejected_until[rank]:  # its checks cannot vouch for it
                self.passes[rank] = 0
            elif not in_rotation and self.passes[rank] >= self.settings.health_rise:
                self._set(rank, True)
            return
        self.fails[rank], self.passes[rank] = self.fails[rank] + 1, 0
        if in_rotation and self.fails[rank] >= self.settings.health_fall:
            self._set(rank, False, f"{why} ({self.fails[rank]} checks in a row)")
        elif not in_rotation:
            for g in self._ranks_of(rank):
                self.last_error[g] = why

    def suspect(self, rank: int, why: str) -> None:
        """A forwarding failure: out of rotation now (it is evidence, not a probe), checked
        again at once; back after ``health_rise`` good checks."""
        self.passes[rank] = 0
        self._set(rank, False, why)
        self._poke.set()

    def broke(self, rank: int) -> None:
        """A stream on ``rank`` broke after its first token: ``health_fall`` in a row (or one on
        probation) take the rank out (module docstring)."""
        self.breaks[rank] += 1
        if self.breaks[rank] < self.settings.health_fall or not self.group.healthy[rank]:
            return
        out_s = min(EJECT_S * 2 ** self.ejections[rank], EJECT_MAX_S)
        self.ejections[rank] += 1
        self.ejected_until[rank] = time.monotonic() + out_s
        self.suspect(rank, f"{self.breaks[rank]} streams in a row broke after their first token "
                     f"(reset, cut short, late or not valid SSE): out for {out_s:g} s")  # fmt: skip

    def served(self, rank: int) -> None:
        """A stream on ``rank`` ended in full: its broken streams are forgiven."""
        self.breaks[rank] = self.ejections[rank] = 0

    def refused_credentials(self, rank: int, why: str) -> None:
        """``rank`` answered 401/403 to a forwarded request: out until it accepts the key."""
        for g in self._ranks_of(rank):
            self.refused[g] = why
        self.suspect(rank, why)

    async def check(self, rank: int) -> None:
        refused = self.refused.get(rank)
        path = "/health" if refused is None else "/v1/models"
        headers = {} if refused is None else self.auth_headers(rank)
        loop = asyncio.get_running_loop()
        start = loop.time()
        try:
            status, _ = await self.fetch(rank, path, headers, CHECK_TIMEOUT_S)
            ok, why = status == 200, f"GET {path} answered {status}"
        except (OSError, TimeoutError) as exc:
            late = loop.time() - start - CHECK_TIMEOUT_S
            if isinstance(exc, TimeoutError) and late > LATE_LOOP_S:
                self.unjudged += 1
                log.warning("GET %s of rank %d timed out %.2f s late: the gateway's event loop "
                            "was stalled, not counted against the rank", path, rank, late)  # fmt: skip
                return
            ok, why = False, f"GET {path} failed: {type(exc).__name__}: {exc}"
        if refused is not None:
            if ok:
                for g in self._ranks_of(rank):
                    self.refused.pop(g, None)
            elif "answered 401" in why or "answered 403" in why:
                why = refused
        self._probed(rank, ok, why)

    def serving_ranks(self) -> set[int]:
        """Ranks in rotation, with no failed check pending, that streamed or finished since
        the last round: their answers are the check (module docstring)."""
        group = self.group
        heard, self.heard_then = group.heard > self.heard_then, group.heard.copy()
        if self.settings.rank_header is not None:  # one upstream: rank 0 stands for all
            ok = bool(heard.any()) and bool(group.healthy.all()) and not self.refused
            return {0} if ok and self.fails[0] == 0 else set()
        return {g for g in range(group.ranks)
                if heard[g] and group.healthy[g] and self.fails[g] == 0 and g not in self.refused}  # fmt: skip

    async def check_all(self) -> None:
        ranks = [0] if self.settings.rank_header is not None else range(self.group.ranks)
        serving = self.serving_ranks()
        self.skipped += len(serving)
        await asyncio.gather(*(self.check(g) for g in ranks if g not in serving))

    async def run(self) -> None:
        """Check every interval (and at once after a suspected failure) until cancelled."""
        while True:
            await self.check_all()
            self._poke.clear()
            try:
                await asyncio.wait_for(self._poke.wait(), self.settings.health_interval_s)
                await asyncio.sleep(0.05)  # let a burst of failures settle first
            except TimeoutError:
                pass

"""The twin live: decode twins beside a service's or a gateway's router, stepped by a worker.

A program routes with :attr:`LiveTwin.weight` (an attribute read: the routing path never waits
for the twin). Its requests reach the twin through a :class:`~.feed.TwinFeed` (events
appended to a deque) and a :class:`TwinWorker` does everything else: numbering finished
requests in arrival order, feeding them to the twins, and stepping each twin while it has
budget: ``work_ratio`` simulated iterations per live iteration the program reports
(:meth:`TwinFeed.tick`), as in ``simulate``. The gateway and the service run the worker in a
child process (:mod:`balanceroute.serving.twinproc`: the replays hold none of the program's GIL; there the cap
counts the child's whole CPU); :meth:`TwinWorker.start` runs it as a thread of the program
(benchmarks, tests), at the program's own priority by default (a lower one, ``nice``, can stall
the program's threads that wait for the GIL while the OS does not run the thread holding it;
docs/design.md), reporting its own CPU time (``time.thread_time``). On top of the simulated
budget, its CPU is capped (``TwinConfig.cpu_share`` of one core over its life): a step starts
only when the worker's CPU so far plus the costliest step's fits the cap, so a twin whose
replays cost more than expected (a slow estimator, a loaded machine) decides more slowly
instead of taking more of the core.

Memory is bounded (docs/design.md, "The twin live"): the feed holds at most ``max_pending``
requests waiting for a number; a twin keeps at most :data:`MAX_LAG` complete blocks it has not
replayed (older ones are skipped, counted in ``twin_blocks_dropped``) and, after each step,
only the rows the next blocks need (:meth:`DecodeTwin.trim`); its sequential test keeps its
``memory`` blocks.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Hashable
from dataclasses import replace
from typing import Any, Protocol

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.twin.config import Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.feed import ArrivalOrder, TwinFeed
from balanceroute.router.lab.twin.sequential import SequentialTest

log = logging.getLogger("balanceroute.twin")
MAX_LAG = 2  # complete blocks a live twin keeps waiting at most (it decides on recent traffic)
PENDING_BLOCKS = 16  # requests waiting for a number: at most this many blocks' worth
POLL_S = 0.05  # the worker's sleep when it has nothing to do
NICE = 0  # steps below the program's OS priority: none (the CPU cap bounds the worker instead)


class TwinJob(Protocol):
    """What the worker steps: fed rows, stepped while it has budget."""

    work_ratio: float
    credit: float
    cpu_s: float

    def observe(self, rows: Finished) -> None: ...

    def ready(self) -> bool: ...

    def step(self) -> int: ...

    def stats(self) -> dict[str, Any]: ...


class LiveTwin:
    """One :class:`DecodeTwin` a program routes with. ``start`` is where its decision starts:
    a start weight (one of the candidates) or a :class:`SequentialTest` to continue (a prior
    measured elsewhere, a warm-up); None: ``w = 0`` with no evidence."""

    def __init__(
        self,
        group: TwinGroup,
        estimator: CompletionEstimator | None,
        config: TwinConfig | None = None,
        *,
        start: float | SequentialTest | None = None,
    ) -> None:
        cfg = config or TwinConfig()
        warm = start if isinstance(start, SequentialTest) else None
        if start is not None and warm is None:
            cfg = replace(cfg, start_weight=float(start))
        self.twin = DecodeTwin(group, estimator, cfg, warm=warm)
        self.work_ratio = cfg.work_ratio
        self.credit = 0.0
        self.cpu_s = 0.0  # the worker thread's CPU on this twin
        self.steps = 0
        self._stats = self._snapshot()  # made by the worker, read by any thread

    @property
    def weight(self) -> float:
        """The blend weight to route with now."""
        return self.twin.weight

    def observe(self, rows: Finished) -> None:
        """Newly numbered finished requests; a twin behind skips its oldest blocks."""
        t = self.twin
        t.observe(rows)
        if t.skip_behind(MAX_LAG):
            t.trim()
            # the shadow learns what finished before the next block it will replay (as the
            # step would): its queue stays bounded however long the twin has no budget
            start = t.next_block * t.stride
            for part in t.parts:
                hit = np.flatnonzero(part.index == start)
                if hit.size:
                    t.shadow.advance_to(float(part.release_s[hit[0]]))
                    break
        self._stats = self._snapshot()

    def ready(self) -> bool:
        return self.twin.ready()

    def step(self) -> int:
        """One decision step on the newest complete block; the simulated iterations."""
        cost = self.twin.step(latest=True)
        self.twin.trim()
        self.steps += 1
        self._stats = self._snapshot()
        return cost

    def memory(self) -> dict[str, int]:
        """What the twin holds (for the bounded-memory test and a status page)."""
        t = self.twin
        return {
            "rows": int(sum(p.index.size for p in t.parts)),
            "flags": int(t.known.size),
            "baseline": len(t.baseline),
            "shadow_heap": len(t.shadow.heap),
            "test_blocks": len(t.test.logs),
        }

    def _snapshot(self) -> dict[str, Any]:
        out = self.twin.stats()
        out["twin_lag_blocks"] = self.twin.complete_blocks()
        out["twin_steps"] = self.steps
        return out

    def stats(self) -> dict[str, Any]:
        """The twin's state: weight, blocks judged, switches, CPU, lag (blocks behind); the
        worker's last snapshot, so any thread may read it while the twin steps."""
        return {**self._stats, "twin_cpu_s": round(self.cpu_s, 4)}  # the thread's CPU


class Channel:
    """One stream of requests (a program's feed) and the jobs it feeds."""

    def __init__(self, max_pending: int) -> None:
        self.feed = TwinFeed()
        self.order = ArrivalOrder(max_pending)
        self.jobs: dict[str, TwinJob] = {}
        self.errors: dict[str, str] = {}
        self.pending: deque[tuple[str, Callable[[], TwinJob] | None]] = deque()
        self.last_iteration: int | None = None
        self.step_cpu_s = 0.0  # the costliest step so far: what the next one reserves

    def add(self, name: str, make: Callable[[], TwinJob]) -> None:
        """A job built by the worker (a model copy is not made on the routing path)."""
        self.pending.append((name, make))

    def remove(self, name: str) -> None:
        self.pending.append((name, None))

    def job(self, name: str) -> TwinJob | None:
        return self.jobs.get(name)

    def service(self, may_step: bool = True) -> bool:
        """Build new jobs, feed them, step each one with budget once (none when ``may_step``
        is false: the CPU cap); whether it stepped."""
        while self.pending:
            name, make = self.pending.popleft()
            self.jobs.pop(name, None)
            if make is None:
                continue
            try:
                self.jobs[name] = make()
                self.errors.pop(name, None)
            except Exception as exc:  # the program routes on at its start weight
                log.exception("twin %s could not be built", name)
                self.errors[name] = f"{type(exc).__name__}: {exc}"
        rows = self.feed.drain(self.order)
        k = self.feed.iteration
        gained = 0 if self.last_iteration is None else max(0, k - self.last_iteration)
        self.last_iteration = k if self.last_iteration is None else max(k, self.last_iteration)
        stepped = False
        for name, job in list(self.jobs.items()):
            t0 = time.thread_time()
            try:
                if rows is not None:
                    job.observe(rows)
                job.credit += job.work_ratio * gained
                if may_step and job.credit > 0 and job.ready():
                    s0 = time.thread_time()
                    cost = job.step()
                    self.step_cpu_s = max(self.step_cpu_s, time.thread_time() - s0)
                    job.credit = min(job.credit - cost, float(cost))
                    stepped = True
            except Exception as exc:  # a twin's bug must not stop the others
                log.exception("twin %s failed", name)
                self.errors[name] = f"{type(exc).__name__}: {exc}"
                self.jobs.pop(name, None)
            job.cpu_s += time.thread_time() - t0
        return stepped


class TwinWorker:
    """The background thread of a program's twins: channels by key, each with its jobs, at
    most ``cpu_share`` of one core over the thread's life (None: no cap)."""

    def __init__(
        self, poll_s: float = POLL_S, cpu_share: float | None = None, nice: int = NICE
    ) -> None:
        if not 0 <= nice <= 19:
            raise ValueError(f"the twin thread's nice must be in [0, 19], got {nice}")
        self.poll_s = poll_s
        self.nice = nice
        self.cpu_share = cpu_share
        self.started: float | None = None  # when the thread started (the cap's clock)
        self.capped_passes = 0  # passes whose steps waited for the cap
        self.channels: dict[Hashable, Channel] = {}
        self.lock = threading.Lock()  # the channel table only; never held by a step
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None
        self.cpu_s = 0.0

    def channel(self, key: Hashable, max_pending: int) -> Channel:
        """The channel of ``key``, made on first use."""
        ch = self.channels.get(key)
        if ch is None:
            with self.lock:
                ch = self.channels.setdefault(key, Channel(max_pending))
        return ch

    def drop(self, key: Hashable) -> None:
        """Forget a channel (its model changed: the twin's verdict was about the old one)."""
        with self.lock:
            self.channels.pop(key, None)

    def keys(self) -> list[Hashable]:
        with self.lock:
            return list(self.channels)

    def start(self) -> None:
        """Start the thread (once)."""
        if self.thread is None:
            self.thread = threading.Thread(target=self._run, name="balanceroute-twin", daemon=True)
            self.thread.start()

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop the thread after its current step."""
        self.stopping.set()
        if self.thread is not None:
            self.thread.join(timeout_s)

    def may_step(self, now: float) -> bool:
        """Whether a step fits the CPU cap now: the thread's CPU so far plus the costliest
        step's at most ``cpu_share`` of the time since the thread started."""
        if self.cpu_share is None or self.started is None:
            return True
        reserve = max((ch.step_cpu_s for ch in list(self.channels.values())), default=0.0)
        return self.cpu_s + reserve <= self.cpu_share * (now - self.started)

    def run_once(self, may_step: bool = True) -> bool:
        """One pass over every channel (the thread's loop body; tests call it directly)."""
        t0 = time.thread_time()
        with self.lock:
            channels = list(self.channels.values())
        busy = False
        for ch in channels:
            busy = ch.service(may_step) or busy
        self.cpu_s += time.thread_time() - t0
        return busy

    def _run(self) -> None:
        if self.nice > 0:
            try:  # ``nice`` steps below the program's priority (the thread starts at its creator's)
                tid = threading.get_native_id()
                own = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(19, own + self.nice))
            except (OSError, AttributeError):
                pass
        self.started = time.monotonic()
        while not self.stopping.is_set():
            may = self.may_step(time.monotonic())
            self.capped_passes += not may
            try:
                busy = self.run_once(may)
            except Exception:  # pragma: no cover - run_once catches the jobs' errors
                log.exception("twin worker pass failed")
                busy = False
            if not busy:
                self.stopping.wait(self.poll_s)


def pending_limit(config: TwinConfig, workers: int, slots: int) -> int:
    """Requests a feed keeps waiting for a number: :data:`PENDING_BLOCKS` blocks' worth."""
    return PENDING_BLOCKS * config.block_size(workers, slots)

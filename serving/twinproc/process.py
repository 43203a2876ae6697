"""The live twins in a child process: the program's loop enqueues and reads, never waits.

A twin's replays are CPU-bound Python: in a thread of the gateway they hold its GIL for tens to
hundreds of milliseconds a step and, on a loaded machine, stall its event loop for seconds
(docs/results.md, "The live twins and the event loop"). Here they run in a child
process (:class:`TwinProcess`, started with ``forkserver``: the gateway has threads;
:mod:`.child`) that holds the :class:`~balanceroute.router.lab.twin.live.TwinWorker`'s channels and jobs. The parent keeps the routing side's
half: per channel a :class:`~balanceroute.router.lab.twin.feed.TwinFeed` (arrivals, finishes, drops appended to a
deque, the iteration clock) and the last state the child reported (each job's weight and
stats, the feed's counts, the child's CPU). :meth:`TwinProcess.pump`, called by the program
on its own thread every :data:`PUMP_S` or so (the gateway's tick, the service's calls), sends
the new events as one frame and reads the child's reports, both without blocking: frames go
over a socket pair with ``MSG_DONTWAIT`` and a bounded send buffer (:mod:`.wire`), so a child inside a long
step (or stopped) costs the parent nothing but buffered bytes. There is no thread in the
parent (a waking thread is itself what stalled the loop under load).

Model copies reach the child pickled in the job factories (:class:`TwinMaker`,
:class:`ComparisonMaker`), at start and after a reload; the child's CPU (its whole process:
replays, unpickling, the feed) is what the ``cpu_share`` cap bounds and what ``cpu_s`` reports.
If the child dies, its jobs' views are cleared (:attr:`TwinProcess.down`: the program routes at
``w = 0``), it is logged once, and a new child starts after a backoff with every channel's
current jobs (they start over, as after a reload); after as many deaths as :data:`BACKOFF_S` has waits it
stays off and says so in :meth:`TwinProcess.status`. :meth:`TwinProcess.stop` ends the child (asked, then
terminated, then killed): no orphan.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import pickle
import socket
import threading
import time
from collections import deque
from collections.abc import Hashable
from typing import Any

from balanceroute.router.lab.twin.feed import TwinFeed
from balanceroute.router.lab.twin.live import NICE, POLL_S
from balanceroute.serving.twinproc.child import ComparisonMaker, Maker, TwinMaker, child_main
from balanceroute.serving.twinproc.wire import Wire

__all__ = ["ComparisonMaker", "TwinMaker", "TwinProcess"]

log = logging.getLogger("balanceroute.twin")
PUMP_S = 0.05  # the parent sends events and reads reports at most this often
MAX_BUFFER = 16 << 20  # bytes the parent holds for a child that does not read: then it is ended
BACKOFF_S = (1.0, 2.0, 4.0, 8.0, 16.0)  # waits before each restart; then the twins stay off
_PRELOAD = ["balanceroute.serving.twinproc.process"]


class JobView:
    """A child's job as the parent last saw it: its weight and stats."""

    def __init__(self, weight: float | None, stats: dict[str, Any]) -> None:
        self.weight = 0.0 if weight is None else float(weight)
        self._stats = stats

    def stats(self) -> dict[str, Any]:
        return dict(self._stats)

    def summary(self) -> dict[str, Any]:
        return dict(self._stats)


class OrderView:
    """The child's :class:`~balanceroute.router.lab.twin.feed.ArrivalOrder` counts, as last reported."""

    def __init__(self) -> None:
        self.numbered = self.dropped = self.given_up = self.late = self.waiting = 0

    def stats(self) -> dict[str, Any]:
        return {
            "twin_requests_numbered": self.numbered,
            "twin_requests_waiting": self.waiting,
            "twin_requests_dropped": self.dropped,
            "twin_requests_given_up": self.given_up,
        }


class ProcChannel:
    """The parent's half of a channel: the feed it appends to, the jobs it asked for (kept to
    rebuild them in a new child) and the views of the child's jobs."""

    def __init__(self, owner: TwinProcess, cid: int, max_pending: int) -> None:
        self.owner, self.cid, self.max_pending = owner, cid, max_pending
        self.feed = TwinFeed()
        self.order = OrderView()
        self.jobs: dict[str, JobView] = {}
        self.errors: dict[str, str] = {}
        self.makers: dict[str, tuple[Maker, threading.Lock | None]] = {}
        self.sent_iteration = -1
        self.head = 0  # the first ticket a new child numbers (the ones before were let go)

    def forget(self) -> None:
        """Let the unsent events go (no child to number them): a new child starts after."""
        self.feed.events.clear()
        self.head = self.feed.tickets  # read after the clear: a later arrival is >= it

    def add(self, name: str, make: Maker, lock: threading.Lock | None = None) -> None:
        """A job for the child (``make`` is pickled under ``lock``, off the caller's path)."""
        self.makers[name] = (make, lock)
        self.owner.outbox.append(("add", self.cid, name))

    def remove(self, name: str) -> None:
        self.makers.pop(name, None)
        self.owner.outbox.append(("remove", self.cid, name))

    def job(self, name: str) -> JobView | None:
        return self.jobs.get(name)


class TwinProcess:
    """The twins' child process, seen from the program: channels by key (as a
    :class:`TwinWorker`'s), fed and read by :meth:`pump` on the program's own thread."""

    def __init__(
        self, poll_s: float = POLL_S, cpu_share: float | None = None, nice: int = NICE
    ) -> None:
        if not 0 <= nice <= 19:
            raise ValueError(f"the twins' process nice must be in [0, 19], got {nice}")
        self.poll_s, self.cpu_share, self.nice = poll_s, cpu_share, nice
        self.channels: dict[Hashable, ProcChannel] = {}
        self.outbox: deque[tuple[Any, ...]] = deque()
        self.lock = threading.Lock()  # one pump at a time (the service calls from threads)
        self.proc: Any = None
        self.wire: Wire | None = None
        self.started = False
        self.stopped = False
        self.down = False  # the child died and no new one has reported yet: w = 0
        self.backoff_s = BACKOFF_S
        self.restarts = 0
        self.exits: list[int | None] = []
        self.next_start = 0.0
        self.last_pump = 0.0
        self.cpu_done = 0.0  # CPU of the children that ended
        self.cpu_now = 0.0  # the running child's, as last reported
        self.capped_passes = 0
        self._ids = 0
        self._acked: Any = None
        self._passes = 0
        self._launcher: threading.Thread | None = None
        self._gave_up = False

    # ---- the program's side ---------------------------------------------------------------
    def channel(self, key: Hashable, max_pending: int) -> ProcChannel:
        """The channel of ``key``, made on first use."""
        ch = self.channels.get(key)
        if ch is None:
            with self.lock:
                ch = self.channels.get(key)
                if ch is None:
                    self._ids += 1
                    ch = self.channels[key] = ProcChannel(self, self._ids, max_pending)
                    self.outbox.append(("open", ch.cid))
        return ch

    def drop(self, key: Hashable) -> None:
        """Forget a channel (its model changed: the twin's verdict was about the old one)."""
        with self.lock:
            ch = self.channels.pop(key, None)
            if ch is not None:
                self.outbox.append(("close", ch.cid))

    def keys(self) -> list[Hashable]:
        return list(self.channels)

    @property
    def cpu_s(self) -> float:
        """CPU seconds of the twins' children (every one so far)."""
        return self.cpu_done + self.cpu_now

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def status(self) -> dict[str, Any]:
        """Whether the child runs, its pid, restarts and the exit codes of those that died."""
        if self.stopped:
            state = "stopped"
        elif self._gave_up:
            state = "off"
        elif self.proc is None:
            state = "idle" if not self.down else "restarting"
        else:
            state = "down" if self.down else "running"
        return {"state": state, "pid": self.pid, "restarts": self.restarts,
                "exit_codes": list(self.exits)}  # fmt: skip

    def start(self) -> None:
        """Start the twins: the child at once if there are jobs (the program is starting),
        else with the first job (no job, no child nor fork server)."""
        self.started = True
        mp.get_context("forkserver").set_forkserver_preload(_PRELOAD)
        with self.lock:
            if self._has_jobs():
                self._install(*self._spawn())

    def pump(self, force: bool = False) -> None:
        """Send the feeds' new events and the pending jobs, read the child's reports, watch
        its life; returns at once (never waits for the child). Call it often (every tick)."""
        now = time.monotonic()
        if not self.started or self.stopped or (not force and now - self.last_pump < PUMP_S):
            return
        if not self.lock.acquire(blocking=False):
            return
        try:
            self.last_pump = now
            self._pump(now)
        finally:
            self.lock.release()

    def run_once(self, timeout_s: float = 60.0) -> None:
        """Everything sent, one pass of the child (its CPU cap aside), its report read:
        what a test steps the twins with."""
        if not self.started:
            self.start()
        self._settle_launch()
        self._passes += 1
        token = self._passes
        with self.lock:
            if self.proc is None and self._has_jobs() and not self._gave_up:
                self._install(*self._spawn())
            self._pump(time.monotonic())
            if self.wire is None:
                return
            self.wire.send(("pass", token))
            deadline = time.monotonic() + timeout_s
            while self._acked != token:
                left = deadline - time.monotonic()
                if left <= 0 or self.wire is None:
                    raise TimeoutError(f"the twins' process did not answer in {timeout_s} s")
                self.wire.flush()
                self._read(min(left, 0.2))
                self._watch(time.monotonic())

    def stop(self, timeout_s: float = 10.0) -> None:
        """End the child: asked to stop (its last report read), terminated, then killed."""
        self.stopped = True
        self._settle_launch()
        with self.lock:
            proc, wire = self.proc, self.wire
            if proc is None or wire is None:
                return
            self._flush_feeds()
            wire.send(("stop",))
            deadline = time.monotonic() + timeout_s
            while not wire.closed and time.monotonic() < deadline:
                wire.flush()
                self._apply(wire.receive(0.1))
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.terminate()
                proc.join(2.0)
            if proc.is_alive():
                proc.kill()
                proc.join(2.0)
            self._ended(proc, quiet=True)

    # ---- inside the pump -------------------------------------------------------------------
    def _pump(self, now: float) -> None:
        if self.proc is None:
            if self._launcher is not None:  # a child is starting: its events wait for it
                return
            if self._gave_up or now < self.next_start or not self._has_jobs():
                for ch in list(self.channels.values()):  # no child to number them
                    ch.forget()
                return
            self._launcher = threading.Thread(target=self._launch, name="balanceroute-twin-start",
                                              daemon=True)  # fmt: skip
            self._launcher.start()  # a process start takes milliseconds to seconds: not here
            return
        self._send_outbox()
        self._flush_feeds()
        self._read(0.0)
        self._watch(now)

    def _has_jobs(self) -> bool:
        return any(ch.makers for ch in list(self.channels.values()))

    def _settle_launch(self) -> None:
        """Wait for a child being started in the background (a test, the stop)."""
        launcher = self._launcher
        if launcher is not None:
            launcher.join(120.0)

    def _launch(self) -> None:
        """The background start of a child; installed unless the twins stopped meanwhile."""
        try:
            proc, ours = self._spawn()
        except Exception:
            log.exception("the live twins' process could not start")
            with self.lock:
                self._launcher = None
                self.next_start = time.monotonic() + self.backoff_s[-1]
            return
        with self.lock:
            self._launcher = None
            if self.stopped:
                proc.kill()
                proc.join(2.0)
                ours.close()
                return
            self._install(proc, ours)

    def _spawn(self) -> tuple[Any, socket.socket]:
        ctx = mp.get_context("forkserver")
        ours, theirs = socket.socketpair()
        proc = ctx.Process(
            target=child_main,
            args=(theirs, self.cpu_share, self.nice, self.poll_s),
            name="balanceroute-twins",
            daemon=True,
        )
        proc.start()
        theirs.close()
        return proc, ours

    def _install(self, proc: Any, ours: socket.socket) -> None:
        """The new child, sent every channel whole (its jobs start over)."""
        self.proc, self.wire = proc, Wire(ours)
        self.cpu_now = 0.0
        self.outbox.clear()  # every channel is sent whole below
        for ch in list(self.channels.values()):
            ch.jobs.clear()
            self._open(ch, with_jobs=True)
        log.info("the live twins run in process %d", proc.pid)

    def _open(self, ch: ProcChannel, *, with_jobs: bool = False) -> None:
        """A channel in the child from now on: its numbering starts at the next ticket."""
        assert self.wire is not None
        self.wire.send(("open", ch.cid, ch.max_pending, ch.head))
        for name in list(ch.makers) if with_jobs else []:
            self._send_add(ch, name)

    def _send_add(self, ch: ProcChannel, name: str) -> None:
        assert self.wire is not None
        entry = ch.makers.get(name)
        if entry is None:
            return
        make, lock = entry
        try:
            if lock is None:
                data = pickle.dumps(make, protocol=pickle.HIGHEST_PROTOCOL)
            else:
                with lock:
                    data = pickle.dumps(make, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception as exc:  # the arm routes on at its start weight: say why
            log.exception("twin %s could not be sent to the twins' process", name)
            ch.errors[name] = f"{type(exc).__name__}: {exc}"
            return
        self.wire.send(("add", ch.cid, name, data))

    def _send_outbox(self) -> None:
        wire = self.wire
        assert wire is not None
        by_id = {ch.cid: ch for ch in list(self.channels.values())}
        while self.outbox:
            op = self.outbox.popleft()
            ch = by_id.get(op[1])
            if op[0] == "open" and ch is not None:
                self._open(ch)
            elif op[0] == "close":
                wire.send(op)
            elif op[0] == "add" and ch is not None:
                self._send_add(ch, op[2])
            elif op[0] == "remove" and ch is not None:
                ch.jobs.pop(op[2], None)
                wire.send(op)

    def _flush_feeds(self) -> None:
        wire = self.wire
        if wire is None:
            return
        for ch in list(self.channels.values()):
            events, it = ch.feed.events, ch.feed.iteration
            if not events and it == ch.sent_iteration:
                continue
            batch = [events.popleft() for _ in range(len(events))]
            wire.send(("feed", ch.cid, batch, it))
            ch.sent_iteration = it
        if len(wire.out) > MAX_BUFFER:  # the child stopped reading: end it, a new one starts
            log.error("the twins' process holds %d unread bytes: ended", len(wire.out))
            self.proc.kill()

    def _read(self, wait_s: float) -> None:
        if self.wire is not None:
            self._apply(self.wire.receive(wait_s))

    def _apply(self, frames: list[Any]) -> None:
        for kind, body in frames:
            if kind != "state":
                continue
            self.down = False
            self.cpu_now = float(body["cpu_s"])
            self.capped_passes = body["capped"]
            by_id = {ch.cid: ch for ch in list(self.channels.values())}
            for cid, row in body["channels"].items():
                ch = by_id.get(cid)
                if ch is None:
                    continue
                ch.jobs = {name: JobView(w, s) for name, (w, s) in row["jobs"].items()}
                ch.errors = {**{k: v for k, v in ch.errors.items() if k not in ch.makers},
                             **row["errors"]}  # fmt: skip
                o = row["order"]
                view = ch.order
                view.numbered, view.dropped, view.given_up = (
                    o["numbered"],
                    o["dropped"],
                    o["given_up"],
                )
                view.late, view.waiting = o["late"], o["waiting"]
            if body["ack"] is not None:
                self._acked = body["ack"]

    def _watch(self, now: float) -> None:
        """A child that died: views cleared (``w = 0``), said once, a restart scheduled."""
        proc = self.proc
        if proc is None or (proc.is_alive() and not (self.wire and self.wire.closed)):
            return
        if proc.is_alive():  # its socket closed under it: it cannot be fed
            proc.kill()
        proc.join(2.0)
        self._ended(proc, quiet=False)
        if self.restarts >= len(self.backoff_s):
            self._gave_up = True
            log.error("the live twins' process died %d times: the twins stay off (w = 0)",
                      self.restarts + 1)  # fmt: skip
            return
        wait = self.backoff_s[self.restarts]
        self.restarts += 1
        self.next_start = now + wait
        log.error("the live twins' process %d died (exit code %s): the driven arms route at "
                  "w = 0; a new one starts in %.0f s", proc.pid, proc.exitcode, wait)  # fmt: skip

    def _ended(self, proc: Any, *, quiet: bool) -> None:
        self.cpu_done += self.cpu_now
        self.cpu_now = 0.0
        if not quiet:
            self.exits.append(proc.exitcode)
            self.down = True
        if self.wire is not None:
            self.wire.sock.close()
        self.proc, self.wire = None, None
        for ch in list(self.channels.values()):
            if not quiet:  # a stop keeps the last report (the summary written after it)
                ch.jobs = {}
            ch.forget()

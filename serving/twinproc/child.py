"""The twins' child process: the jobs' factories it builds and its loop (:func:`child_main`).

The child holds a :class:`~balanceroute.router.lab.twin.live.TwinWorker`'s channels (one per program feed) and their
jobs; a reader thread drains the parent's frames (so the socket never fills while a step runs);
the main thread services the channels under the CPU cap (the child's whole CPU since it started)
and reports every job's weight and stats, the feed's counts and its CPU (:data:`REPORT_S` when
something changed, after every step, at least every :data:`IDLE_REPORT_S`). It ends when asked,
or when its socket closes (the program is gone); it ignores the terminal's SIGINT (the
program's). The factories are pickled by the parent with the model copies in them.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import signal
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.twin.compare import ArmComparison, ComparedArm
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.live import Channel, LiveTwin, TwinJob, TwinWorker
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.serving.twinproc.wire import Wire

log = logging.getLogger("balanceroute.twin")
REPORT_S = 0.25  # the child reports at most this often (and after every step)
IDLE_REPORT_S = 1.0  # ... and at least this often (its CPU)


@dataclass(slots=True)
class TwinMaker:
    """A :class:`LiveTwin` on a model copy, built in the child."""

    group: TwinGroup
    model: CompletionEstimator | None
    config: TwinConfig
    start: float | SequentialTest | None = None

    def __call__(self, channel: Channel) -> TwinJob:
        return LiveTwin(self.group, self.model, self.config, start=self.start)


@dataclass(slots=True)
class _SiblingWeight:
    """A driven arm's live weight in the child: its twin's on the same channel, else its
    start weight."""

    channel: Channel
    label: str
    fallback: float

    def __call__(self) -> float:
        job = self.channel.job(self.label)
        return self.fallback if job is None else float(job.weight)  # type: ignore[attr-defined]


@dataclass(slots=True)
class ComparisonMaker:
    """The arms' counterfactual A/B, built in the child: ``arms`` are (label, spec, model
    copy, start weight if a twin drives it else None)."""

    arms: list[tuple[str, Any, CompletionEstimator | None, float | None]]
    group: TwinGroup
    config: TwinConfig

    def __call__(self, channel: Channel) -> TwinJob:
        compared = [
            ComparedArm(label, spec, model,
                        None if w is None else _SiblingWeight(channel, label, w))
            for label, spec, model, w in self.arms
        ]  # fmt: skip
        return ArmComparison(compared, self.group, self.config)


Maker = Callable[[Channel], TwinJob]


def child_main(sock: socket.socket, cpu_share: float | None, nice: int, poll_s: float) -> None:
    """The child's life: read the parent's frames (a reader thread, so the socket never fills
    while a step runs), service the channels under the CPU cap, report; until asked to stop
    or the parent is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the program's Ctrl-C is the program's
    if nice > 0:
        with contextlib.suppress(OSError):
            os.nice(nice)
    _Child(sock, cpu_share, poll_s).run()


class _Child:
    """The twins' process: the worker's channels by id, fed by the parent's frames."""

    def __init__(self, sock: socket.socket, cpu_share: float | None, poll_s: float) -> None:
        self.sock, self.poll_s = sock, poll_s
        self.cpu0 = time.process_time()
        self.worker = TwinWorker(poll_s=poll_s, cpu_share=cpu_share)
        self.worker.started = time.monotonic()  # the cap's clock: the child's life
        self.wire = Wire(sock)
        self.inbox: deque[Any] = deque()
        self.wake = threading.Event()
        self.eof = threading.Event()
        self.channels: dict[int, Channel] = {}
        self.ack: Any = None
        self.stopping = False

    def _read(self) -> None:
        reader = Wire(self.sock)
        while not reader.closed:
            self.inbox.extend(reader.receive(wait_s=None))
            self.wake.set()
        self.eof.set()
        self.wake.set()

    def handle(self, msg: tuple[Any, ...]) -> None:
        """One frame of the parent's."""
        kind, channels = msg[0], self.channels
        if kind == "feed":
            _, cid, events, iteration = msg
            ch = channels.get(cid)
            if ch is not None:
                ch.feed.events.extend(events)
                ch.feed.iteration = max(ch.feed.iteration, iteration)
        elif kind == "open":
            _, cid, max_pending, head = msg
            ch = self.worker.channels[cid] = channels[cid] = Channel(max_pending)
            ch.order.head = head
        elif kind == "close":
            channels.pop(msg[1], None)
            self.worker.channels.pop(msg[1], None)
        elif kind == "add" and msg[1] in channels:
            _add(channels[msg[1]], msg[2], msg[3])
        elif kind == "remove" and msg[1] in channels:
            channels[msg[1]].remove(msg[2])
        elif kind == "pass":  # one pass now, whatever the cap (tests)
            self.worker.run_once(True)
            self.ack = msg[1]
        elif kind == "stop":
            self.stopping = True

    def run(self) -> None:
        threading.Thread(target=self._read, name="balanceroute-twin-reader", daemon=True).start()
        worker, wire = self.worker, self.wire
        last_report, busy = 0.0, False
        while True:
            if not busy:
                self.wake.wait(self.poll_s)
            self.wake.clear()
            changed = bool(self.inbox)
            while self.inbox:
                self.handle(self.inbox.popleft())
            if self.eof.is_set() and not self.inbox:
                self.stopping = True
            may = worker.may_step(time.monotonic())
            worker.capped_passes += not may
            stepped = worker.run_once(may)
            busy = stepped and not self.stopping
            worker.cpu_s = time.process_time() - self.cpu0  # the child's whole CPU: the cap's
            now = time.monotonic()
            due = IDLE_REPORT_S if not (changed or stepped) else REPORT_S
            if self.stopping or self.ack is not None or stepped or now - last_report >= due:
                wire.flush()
                if not wire.out:  # the last report was taken: send the newest
                    wire.send(("state", _report(worker, self.channels, self.ack)))
                    self.ack, last_report = None, now
            if self.stopping:
                self.sock.settimeout(5.0)
                with contextlib.suppress(OSError):
                    self.sock.sendall(bytes(wire.out))
                return


def _add(ch: Channel, name: str, data: bytes) -> None:
    """A job from its pickled factory (a factory that does not load is the job's error)."""
    try:
        maker = pickle.loads(data)
    except Exception as exc:
        log.exception("twin %s could not be loaded", name)
        ch.pending.append((name, None))
        ch.errors[name] = f"{type(exc).__name__}: {exc}"
        return
    ch.add(name, lambda: maker(ch))


def _report(worker: TwinWorker, channels: dict[int, Channel], ack: Any) -> dict[str, Any]:
    """What the parent shows: every job's weight and stats, errors, the feed's counts."""
    rows = {}
    for cid, ch in channels.items():
        jobs = {name: (getattr(job, "weight", None), job.stats()) for name, job in ch.jobs.items()}
        order = ch.order
        counts = {"numbered": order.numbered, "dropped": order.dropped,
                  "given_up": order.given_up, "late": order.late,
                  "waiting": len(order.pending)}  # fmt: skip
        rows[cid] = {"jobs": jobs, "errors": dict(ch.errors), "order": counts}
    return {"pid": os.getpid(), "cpu_s": worker.cpu_s, "capped": worker.capped_passes,
            "channels": rows, "ack": ack}  # fmt: skip

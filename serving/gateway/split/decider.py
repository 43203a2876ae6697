"""The decider process of a split gateway (``balanceroute gateway --relay-workers N``).

It holds everything one gateway decides with (:class:`~balanceroute.serving.gateway.runtime.Gateway`:
the pool, the policies and estimators, the switchback, the completion log, rank health, the
metrics) on a :class:`~.clock.ClockedGroup`, and applies the relay workers' events (:mod:`.wire`)
to it through the same :class:`~balanceroute.serving.gateway.life.RequestLife` the one-process
gateway uses. It opens the client port once and hands the listening socket to N relay workers
(:mod:`.worker`), which accept on it in turn; its own app (probes, metrics, A/B, reload, models)
listens on a Unix socket the workers pass those paths to. Its health checks and step-counter
reads go over kept-alive connections of its own (:meth:`~..plane.upstream.RankPool.get`).

Faults: a worker that dies (its event line ends) has every request it held leave the group at
once (counted ``relay_lost``: their slots are free for the next decision) and is started again;
connections the kernel queued on the shared socket wait for the other workers, so nothing that
had not been accepted is lost. SIGTERM drains: the workers stop accepting and finish (or end)
their streams within the drain deadline while the decider keeps deciding, then it stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

from balanceroute.serving.gateway import server
from balanceroute.serving.gateway.app import create_gateway_app
from balanceroute.serving.gateway.life import (
    LiveRequest,
    NoRankInRotation,
    PoolFull,
    RequestLife,
    arrive,
)
from balanceroute.serving.gateway.plane.upstream import RankPool
from balanceroute.serving.gateway.runtime import UPSTREAM_KEY_ENV, Gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.split import wire
from balanceroute.serving.gateway.split.clock import ClockedGroup, EngineCounters
from balanceroute.serving.gateway.split.worker import SPEC_ENV
from balanceroute.serving.http.server import configure_logging, serve

log = logging.getLogger("balanceroute.gateway")
WORKERS = {  # the relay workers' module, by ``relay_plane``
    "protocol": [sys.executable, "-m", "balanceroute.serving.gateway.plane.worker"],
    "aiohttp": [sys.executable, "-m", "balanceroute.serving.gateway.split.worker"],
}
RELAY_LOST = "relay_lost"
RESPAWN_S = 1.0  # a worker is started at most this often


def build_decider(settings: GatewaySettings) -> Gateway:
    """The gateway's state on a group that ages requests by the ranks' clocks."""
    group = ClockedGroup.sized(settings.group, settings.slots, settings.max_pool)
    gateway = server.build_gateway(settings, group=group)
    group.attach(gateway.clock)
    return gateway


@dataclass
class Remote:
    """One worker's request, as the decider holds it."""

    req: LiveRequest
    life: RequestLife
    waiting: asyncio.Task | None = None


@dataclass
class Link:
    """One relay worker's event line and the requests it holds."""

    writer: asyncio.StreamWriter
    requests: dict[int, Remote] = field(default_factory=dict)
    out: list[bytes] = field(default_factory=list)  # events not yet written
    deliver: Callable[[list[Any]], None] | None = None  # an in-process front: events as calls


class Decider:
    """Applies the relay workers' events to the gateway, and keeps the workers running."""

    def __init__(self, gw: Gateway, listener: socket.socket, folder: str) -> None:
        self.gw = gw
        self.listener = listener
        self.events = os.path.join(folder, "events.sock")
        self.control = os.path.join(folder, "control.sock")
        self.workers: list[subprocess.Popen | None] = [None] * gw.settings.relay_workers
        self.stopping = False
        self.restarts = 0
        self._server: asyncio.base_events.Server | None = None
        self._watch: asyncio.Task | None = None
        self._counters: asyncio.Task | None = None
        self.probes = RankPool(gw.settings)  # health checks and step-counter reads

    # ---- the event lines ------------------------------------------------------------------
    async def start(self) -> None:
        self._server = await asyncio.start_unix_server(self._serve_link, self.events,
                                                       limit=wire.LIMIT)  # fmt: skip
        for i in range(len(self.workers)):
            self._spawn(i)
        loop = asyncio.get_running_loop()
        self._watch = loop.create_task(self._supervise())
        s = self.gw.settings
        counters = EngineCounters(self.gw.group, s.rank_url, s.rank_header is not None,  # type: ignore[arg-type]
                                  s.health_interval_s)  # fmt: skip
        self.gw.health.fetch = self.probes.get
        self._counters = loop.create_task(counters.run(self.gw.session, self.probes.get))

    async def _serve_link(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        link = Link(writer)
        try:
            while line := await reader.readline():
                try:
                    self.apply(link, wire.decode(line))
                except Exception:  # one bad event must not stop the others
                    log.exception("relay event %r failed", line[:120])
        except OSError as exc:
            log.warning("a relay worker's event line broke: %s", exc)
        finally:
            self.lost(link)
            writer.close()

    def lost(self, link: Link) -> None:
        """The worker is gone: every request it held leaves the group now."""
        if link.requests:
            log.warning("a relay worker left with %d requests: their slots are freed",
                        len(link.requests))  # fmt: skip
        for remote in link.requests.values():
            if remote.waiting is not None:
                remote.waiting.cancel()
            remote.life.abandoned(RELAY_LOST)
        link.requests.clear()

    def apply(self, link: Link, ev: list[Any]) -> None:
        """One event from ``link`` (:mod:`.wire`)."""
        op, rid = ev[0], ev[1]
        if op == wire.ADMIT:
            self._admit(link, rid, ev)
            return
        if op == wire.COUNT:
            self.gw.metrics.outcomes.labels(str(ev[2])).inc()
            return
        remote = link.requests.get(rid)
        if remote is None:
            return
        life, pos = remote.life, remote.req.position
        group: ClockedGroup = self.gw.group  # type: ignore[assignment]
        if op == wire.FIRST:
            group.first_token(pos, float(ev[2]))
        elif op == wire.FINISH:
            _, _, rank, first_t, last_t, tokens, prompt, reason = ev
            link.requests.pop(rid)
            if prompt > 0:
                group.correct_prompt(pos, int(prompt))
            group.finish_seen(pos, float(first_t), float(last_t), int(tokens))
            now = self.gw.clock()
            self.gw.switchback.tokens(int(tokens), now)
            life.finished(int(rank), float(first_t), float(last_t), int(tokens), int(prompt), now,
                          reason)  # fmt: skip
        elif op == wire.SUSPECT:
            life.rank_failed(int(ev[2]), str(ev[3]))
        elif op == wire.REFUSED:
            life.rank_refused(int(ev[2]), int(ev[3]))
        elif op == wire.REQUEUE:
            last = bool(ev[3])
            if life.requeued(int(ev[2]), last):
                self._await_rank(link, rid, remote)
            elif not last:
                self._send(link, wire.ASSIGN, rid, -1)
        elif op == wire.ABANDON:
            link.requests.pop(rid)
            if remote.waiting is not None:
                remote.waiting.cancel()
            life.abandoned(ev[2])

    def _admit(self, link: Link, rid: int, ev: list[Any]) -> None:
        _, _, tokens, key_hash, key, request_id, stream = ev
        gw = self.gw
        if gw.drain.draining:
            self._send(link, wire.REJECT, rid, 503, "the gateway is shutting down")
            return
        if not gw.group.healthy.any():
            why = "; ".join(f"rank {g}: {e}" for g, e in sorted(gw.health.last_error.items()))
            self._send(link, wire.REJECT, rid, 503,
                       f"no rank is in rotation ({why or 'health checks failing'})")  # fmt: skip
            return
        checked = SimpleNamespace(stream=stream, stream_options=None)
        try:
            req = arrive(gw, request_id=request_id, path="", chat=False, body={}, checked=checked,
                         tokens=int(tokens), key=str(key), key_hash=int(key_hash))  # fmt: skip
        except PoolFull as full:
            self._send(link, wire.REJECT, rid, 429, str(full))
            return
        remote = Remote(req, RequestLife(gw, req))
        link.requests[rid] = remote
        self._await_rank(link, rid, remote)

    def _await_rank(self, link: Link, rid: int, remote: Remote) -> None:
        rank = remote.life.admitted_now()
        if rank is not None:  # decided on arrival: no task, no wait
            self._send(link, wire.ASSIGN, rid, rank)
            return

        async def assign() -> None:
            try:
                rank = await remote.life.admitted()
            except NoRankInRotation as exc:  # the outage outlasted --no-rank-wait: 503
                remote.waiting = None
                link.requests.pop(rid, None)
                remote.life.abandoned("no_rank")
                self._send(link, wire.REJECT, rid, 503, str(exc))
                return
            remote.waiting = None
            self._send(link, wire.ASSIGN, rid, rank)

        remote.waiting = asyncio.get_running_loop().create_task(assign())

    def _send(self, link: Link, *fields: Any) -> None:
        """One event to ``link``'s worker; a decision's admissions leave in one write (to an
        in-process front, at once)."""
        if link.deliver is not None:
            link.deliver(list(fields))
            return
        link.out.append(wire.encode(*fields))
        if len(link.out) == 1:
            asyncio.get_running_loop().call_soon(self._flush, link)

    def _flush(self, link: Link) -> None:
        out, link.out = link.out, []
        if out and not link.writer.is_closing():
            link.writer.write(b"".join(out))

    # ---- the workers ----------------------------------------------------------------------
    def _spawn(self, index: int) -> None:
        s = self.gw.settings
        data = s.model_dump(mode="json")
        data["api_token"] = s.token
        spec = {"settings": data, "fd": self.listener.fileno(), "events": self.events,
                "control": self.control, "index": index,
                "upstream_key": self.gw.upstream_key}  # fmt: skip
        env = {**os.environ, SPEC_ENV: json.dumps(spec)}
        env.pop(UPSTREAM_KEY_ENV, None)
        argv = WORKERS[s.relay_plane]
        self.workers[index] = subprocess.Popen(argv, env=env, pass_fds=(self.listener.fileno(),))

    async def _supervise(self) -> None:
        """Start again any worker that died (checked every tenth of a health interval; a worker
        is started at most once a second, so one that cannot start does not spin)."""
        every = max(0.05, self.gw.settings.health_interval_s / 10)
        loop = asyncio.get_running_loop()
        started = [loop.time()] * len(self.workers)
        while not self.stopping:
            await asyncio.sleep(every)
            for i, proc in enumerate(self.workers):
                if proc is None or proc.poll() is None or self.stopping:
                    continue
                if loop.time() - started[i] < RESPAWN_S:
                    continue
                log.warning("relay worker %d (pid %d) exited with %s: starting it again", i,
                            proc.pid, proc.returncode)  # fmt: skip
                self.restarts += 1
                started[i] = loop.time()
                self._spawn(i)

    def begin_drain(self) -> None:
        """Shutdown began: the workers drain their streams (the decider keeps deciding)."""
        self.stopping = True
        self.gw.drain.begin()
        for proc in self.workers:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        """Wait for the workers to finish (the drain deadline and a grace), then close."""
        self.stopping = True
        for task in (self._watch, self._counters):
            if task is not None:
                task.cancel()
        deadline = self.gw.settings.drain_timeout_s + server.GRACE_S + 2
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        for proc in self.workers:
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            while proc.poll() is None and loop.time() < end:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if self._server is not None:
            self._server.close()
        self.probes.close()


def listen(settings: GatewaySettings) -> socket.socket:
    """The client port, opened once (the relay workers inherit it)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((settings.host, settings.port))
    listener.listen(4096)
    listener.set_inheritable(True)
    return listener


def run_split(settings: GatewaySettings, gateway: Gateway) -> None:
    """Serve with ``settings.relay_workers`` relay workers until SIGTERM or SIGINT."""
    configure_logging(settings)
    listener = listen(settings)
    folder = tempfile.mkdtemp(prefix="balanceroute-gateway-")
    decider = Decider(gateway, listener, folder)
    app = create_gateway_app(gateway)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with inner(app):
            await decider.start()
            try:
                yield
            finally:
                await decider.stop()

    app.router.lifespan_context = lifespan
    port = listener.getsockname()[1]
    log.warning("split gateway: %d relay workers on port %d, the decider on %s",
                settings.relay_workers, port, decider.control)  # fmt: skip
    try:
        serve(app, settings, collect=True, uds=decider.control,
              on_shutdown=decider.begin_drain,
              timeout_graceful_shutdown=int(settings.drain_timeout_s) + server.GRACE_S)  # fmt: skip
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)

"""Start a gateway: its app, its decider, and the data plane in this process or in N relay
worker processes (``--relay-workers N``), until SIGINT or SIGTERM.

The client port is opened once. With no relay workers the Protocol front (:mod:`.plane.front`)
accepts on it on this process's event loop and calls the decider directly (on two cores one
process beats two: no event crosses a socket, no second event loop competes for a core). With N
relay workers each accepts on the same socket in turn and reaches the decider through its proxy
(:mod:`.plane.wire`); a worker that dies is started again (its requests leave the group at
once), and connections the kernel queued wait for the other workers. The gateway's own app
(probes, ``/metrics``, ``/v1/ab``, reload, models) runs in this process: the front calls it
directly, and with relay workers a second front here answers the paths they pass to it on a
Unix socket.

SIGTERM drains: the client port is closed at once in every layout (new connections are
refused), new requests on open connections get 503, the streams in flight get
``drain_timeout_s`` to finish, then end with an SSE error event; the decider keeps deciding until
they have. The Unix sockets' folder (relay workers only) is removed on the way out.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

import uvloop

from balanceroute.serving.gateway.app import create_gateway_app
from balanceroute.serving.gateway.decider import Decider
from balanceroute.serving.gateway.plane.front import Front
from balanceroute.serving.gateway.plane.request import PlaneContext
from balanceroute.serving.gateway.plane.wire import Links
from balanceroute.serving.gateway.runtime import UPSTREAM_KEY_ENV, Gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.http.server import configure_logging

log = logging.getLogger("balanceroute.gateway")
GRACE_S = 3  # after the drain deadline: the cut streams' last events and the shutdown itself
RESPAWN_S = 1.0  # a worker is started at most this often
WORKER = [sys.executable, "-m", "balanceroute.serving.gateway.plane.worker"]
SECRET_ENV = {UPSTREAM_KEY_ENV, "BALANCEROUTE_API_TOKEN"}  # a worker gets them by its spec


class Workers:
    """N relay worker processes on the shared socket, their lines to the decider, and their
    restarts."""

    def __init__(self, gw: Gateway, decider: Decider, listener: socket.socket, folder: str) -> None:
        self.gw = gw
        self.listener = listener
        self.events = os.path.join(folder, "events.sock")
        self.control = os.path.join(folder, "control.sock")  # the app, to the workers
        self.links = Links(decider)
        self.procs: list[subprocess.Popen | None] = [None] * gw.settings.relay_workers
        self.stopping = False
        self.restarts = 0
        self._watch: asyncio.Task | None = None

    async def start(self) -> None:
        """Listen for the workers' lines, start them, and watch them."""
        await self.links.start(self.events)
        for i in range(len(self.procs)):
            self._spawn(i)
        self._watch = asyncio.get_running_loop().create_task(self._supervise())

    def _spawn(self, index: int) -> None:
        """Start worker ``index`` with its spec (settings, the socket, the decider's paths)."""
        s = self.gw.settings
        data = s.model_dump(mode="json")
        data["api_token"] = s.token
        spec = {"settings": data, "fd": self.listener.fileno(), "events": self.events,
                "control": self.control, "index": index, "upstream_key": self.gw.upstream_key}  # fmt: skip
        env = {k: v for k, v in os.environ.items() if k not in SECRET_ENV}
        proc = subprocess.Popen(WORKER, env=env, stdin=subprocess.PIPE,
                                pass_fds=(self.listener.fileno(),))  # fmt: skip
        assert proc.stdin is not None
        with proc.stdin:  # secrets by pipe: never in a worker's environment or command line
            proc.stdin.write(json.dumps(spec).encode())
        self.procs[index] = proc
        self.links.allowed.add(proc.pid)

    async def _supervise(self) -> None:
        """Start again any worker that died (checked every tenth of a health interval; a worker
        is started at most once a second, so one that cannot start does not spin)."""
        every = max(0.05, self.gw.settings.health_interval_s / 10)
        loop = asyncio.get_running_loop()
        started = [loop.time()] * len(self.procs)
        while not self.stopping:
            await asyncio.sleep(every)
            for i, proc in enumerate(self.procs):
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
        for proc in self.procs:
            if proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGTERM)

    async def stop(self) -> None:
        """Wait for the workers to finish (the drain deadline and a grace), then close."""
        self.stopping = True
        if self._watch is not None:
            self._watch.cancel()
        loop = asyncio.get_running_loop()
        end = loop.time() + self.gw.settings.drain_timeout_s + GRACE_S + 2
        for proc in self.procs:
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            while proc.poll() is None and loop.time() < end:
                await asyncio.sleep(0.05)
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.links.close()


def listen(settings: GatewaySettings) -> socket.socket:
    """The client port, opened once (relay workers inherit it)."""
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((settings.host, settings.port))
    listener.listen(4096)
    listener.set_inheritable(True)
    return listener


def run(settings: GatewaySettings, gw: Gateway) -> None:
    """Serve ``gw`` with ``settings.relay_workers`` relay workers (0: the front in this
    process) until SIGTERM or SIGINT."""
    configure_logging(settings)
    listener = listen(settings)
    # the workers' Unix sockets (none without workers), private to this user
    folder = tempfile.mkdtemp(prefix="balanceroute-gateway-") if settings.relay_workers else ""
    try:
        uvloop.run(serve(gw, listener, folder))
    finally:
        listener.close()
        if folder:
            with contextlib.suppress(OSError):
                shutil.rmtree(folder)


async def serve(gw: Gateway, listener: socket.socket, folder: str) -> None:
    """The app's life around the data plane: started, serving until SIGTERM or SIGINT, then
    drained (new requests 503, the streams in flight until the drain deadline) and stopped."""
    settings, loop = gw.settings, asyncio.get_running_loop()
    decider = Decider(gw)
    app = create_gateway_app(gw)
    front = Front(PlaneContext(settings, decider, gw.upstream_key, gw.drain), gw.counter, app=app)
    workers = Workers(gw, decider, listener, folder) if settings.relay_workers else None
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gc.collect()
    gc.freeze()  # the imports and models live as long as the process: shorter GC pauses
    async with app.router.lifespan_context(app):
        if workers is None:
            await front.listen(sock=listener)
        else:
            await front.listen(path=workers.control)
            await workers.start()
        log.warning("gateway on http://%s:%d in front of %d ranks x %d slots; arms: %s; %s",
                    settings.host, listener.getsockname()[1], settings.group, settings.slots,
                    ", ".join(a.label for a in gw.arms),
                    f"{settings.relay_workers} relay workers" if workers is not None
                    else "the Protocol front in this process")  # fmt: skip
        await stop.wait()
        front.begin_drain()
        if workers is not None:
            workers.begin_drain()
            listener.close()  # with the workers' copies closed, new clients are refused at once
            await workers.stop()
        await front.drained(GRACE_S)

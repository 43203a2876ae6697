"""The Protocol front and the decider in one process (``balanceroute gateway --front protocol``):
the clients' connections are served by :mod:`.front` on the decider's own event loop, and a
request's events reach the decider by a direct call instead of the Unix socket (admissions come
back the same way). The decider's app (probes, ``/metrics``, ``/v1/ab``, reload, models) still
listens on its Unix socket, where the front passes every other path, as in the split gateway.

On two cores one process can beat two: no event crosses a socket and no second event loop
competes for a core. SIGTERM drains as the split gateway does (new requests 503, the streams in
flight get ``drain_timeout_s``, then end with an SSE error event).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import shutil
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from balanceroute.serving.gateway import server
from balanceroute.serving.gateway.app import create_gateway_app
from balanceroute.serving.gateway.plane.front import Connection, Front
from balanceroute.serving.gateway.plane.worker import GRACE_S
from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.split import wire
from balanceroute.serving.gateway.split.channel import DeciderChannel
from balanceroute.serving.gateway.split.decider import Decider, Link, listen
from balanceroute.serving.gateway.split.lean import WorkerContext
from balanceroute.serving.http.server import configure_logging, serve

log = logging.getLogger("balanceroute.gateway")


class LocalChannel(DeciderChannel):
    """The event line as direct calls into the decider (and the decider's link writes straight
    back into it)."""

    def __init__(self, decider: Decider) -> None:
        super().__init__("", on_lost=lambda: None)
        self.decider = decider
        self.link = Link(self, deliver=self.deliver)  # type: ignore[arg-type]

    async def open(self) -> None:
        return None

    def send(self, *fields: object) -> None:
        """One event applied by the decider now."""
        try:
            self.decider.apply(self.link, list(fields))
        except Exception:  # one bad event must not stop the others
            log.exception("relay event %r failed", fields[:2])

    def write(self, data: bytes) -> None:
        """The decider's answers (its link's writer)."""
        for line in data.splitlines():
            self.deliver(wire.decode(line))

    def is_closing(self) -> bool:
        return False

    async def close(self) -> None:
        self.decider.lost(self.link)


class InProcess:
    """The front of one process: its connections, and their drain at shutdown."""

    def __init__(self, gateway: Gateway, decider: Decider) -> None:
        self.gateway = gateway
        self.decider = decider
        self.channel = LocalChannel(decider)
        self.ctx = WorkerContext(gateway.settings, self.channel, gateway.upstream_key)
        self.ctx.drain = gateway.drain  # one process, one drain clock (and one shutdown line)
        self.front = Front(self.ctx, gateway.counter, decider.control)
        self.server: asyncio.base_events.Server | None = None

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self.server = await loop.create_server(lambda: Connection(self.front),
                                               sock=self.decider.listener, backlog=4096)  # fmt: skip

    def begin_drain(self) -> None:
        """Shutdown began: stop accepting, 503 to new requests, the streams drain."""
        self.decider.begin_drain()  # starts the drain the front shares (self.ctx.drain)
        if self.server is not None:
            self.server.close()
        self.front.close_idle()

    async def stop(self) -> None:
        """Wait for the streams (the drain deadline, then they end themselves), then close."""
        front = self.front
        if not front.idle.is_set():
            over = asyncio.ensure_future(self.ctx.drain.over.wait())
            quiet = asyncio.ensure_future(front.idle.wait())
            await asyncio.wait({over, quiet}, return_when=asyncio.FIRST_COMPLETED)
            over.cancel()
            quiet.cancel()
        if not front.idle.is_set():
            front.drain_over()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(front.idle.wait(), GRACE_S)
        front.pool.close()
        await self.channel.close()


def run_inprocess(settings: GatewaySettings, gateway: Gateway) -> None:
    """Serve the Protocol front and the decider in this process until SIGTERM or SIGINT."""
    configure_logging(settings)
    listener = listen(settings)
    folder = tempfile.mkdtemp(prefix="balanceroute-gateway-")
    decider = Decider(gateway, listener, folder)
    here = InProcess(gateway, decider)
    app = create_gateway_app(gateway)
    inner = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        async with inner(app):
            await decider.start()
            await here.start()
            try:
                yield
            finally:
                await here.stop()
                await decider.stop()

    app.router.lifespan_context = lifespan
    log.warning("gateway: the Protocol front on port %d, the decider's app on %s",
                listener.getsockname()[1], decider.control)  # fmt: skip
    try:
        serve(app, settings, collect=True, uds=decider.control, on_shutdown=here.begin_drain,
              timeout_graceful_shutdown=int(settings.drain_timeout_s) + server.GRACE_S)  # fmt: skip
    finally:
        listener.close()
        with contextlib.suppress(OSError):
            shutil.rmtree(folder)

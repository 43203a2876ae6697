"""The uvicorn skeleton every BalanceRoute HTTP process runs: logging from the settings, a frozen
heap (the imports and models live as long as the process: shorter GC pauses), then uvicorn on
the settings' address until SIGINT or SIGTERM, its requests bounded in time
(:mod:`~balanceroute.serving.http.deadline`: header, body and keep-alive idle deadlines)."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import logging
import socket
from collections.abc import Callable
from types import FrameType
from typing import Any

import uvicorn

from balanceroute.serving.http.deadline import deadline_protocol
from balanceroute.serving.http.settings import ServiceSettings

STAMP = "%(asctime)s "  # every log line starts with its time
TICK_S = 1.0  # the main loop's tick (uvicorn's own: 0.1 s)


def configure_logging(settings: ServiceSettings) -> None:
    """The process's log level and format (timestamped), from the settings."""
    logging.basicConfig(
        level=settings.log_level.upper(), format=STAMP + "%(levelname)s:  %(message)s"
    )


def uvicorn_log_config() -> dict[str, Any]:
    """uvicorn's own logging configuration with a timestamp on every line."""
    config = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    for formatter in config["formatters"].values():
        formatter["fmt"] = STAMP + formatter["fmt"]
    return config


class NotifyingServer(uvicorn.Server):
    """uvicorn's server, calling ``on_shutdown`` the moment shutdown begins (it stops accepting
    connections, then waits for the open ones), so the app can drain its streams in time.

    Its main loop ticks once a second (the rate of the ``date`` header it refreshes) instead of
    uvicorn's ten times, and SIGTERM or SIGINT wakes it at once: each wake-up of an idle process
    costs CPU (about 0.1 ms on a busy two-core machine, ``benchmarks/perf/gateway_profile.py``)."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown
        self._woken: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if self._loop is not None and self._woken is not None:
            self._loop.call_soon_threadsafe(self._woken.set)

    async def main_loop(self) -> None:
        """uvicorn's loop (:meth:`uvicorn.Server.main_loop`) at :data:`TICK_S`."""
        self._loop, self._woken = asyncio.get_running_loop(), asyncio.Event()
        counter = 0
        should_exit = await self.on_tick(counter)
        while not should_exit:
            counter = (counter + 10) % 864000  # uvicorn refreshes its date every tenth tick
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), TICK_S)
            should_exit = await self.on_tick(counter)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets=sockets)


def serve(
    app: Any,
    settings: ServiceSettings,
    *,
    collect: bool = False,
    on_shutdown: Callable[[], None] | None = None,
    **options: Any,
) -> None:
    """Run ``app`` under uvicorn until stopped (``collect``: a full collection before the heap is
    frozen; ``on_shutdown``: called when SIGTERM or SIGINT starts the shutdown; ``options``: more
    uvicorn options)."""
    if collect:
        gc.collect()
    gc.freeze()
    kw = dict(host=settings.host, port=settings.port, log_level=settings.log_level,
              access_log=settings.access_log, log_config=uvicorn_log_config(),
              http=deadline_protocol(settings.header_timeout_s, settings.body_timeout_s),
              timeout_keep_alive=settings.idle_timeout_s)  # fmt: skip
    kw.update(options)
    if on_shutdown is None:
        uvicorn.run(app, **kw)
        return
    NotifyingServer(uvicorn.Config(app, **kw), on_shutdown).run()

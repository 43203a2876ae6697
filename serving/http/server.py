"""The uvicorn skeleton every BalanceRoute HTTP process runs: logging from the settings, a frozen
heap (the imports and models live as long as the process: shorter GC pauses), then uvicorn on
the settings' address until SIGINT or SIGTERM, its requests bounded in time
(:mod:`~balanceroute.serving.http.deadline`: header, body and keep-alive idle deadlines)."""

from __future__ import annotations

import copy
import gc
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn

from balanceroute.serving.http.deadline import deadline_protocol
from balanceroute.serving.http.settings import ServiceSettings

STAMP = "%(asctime)s "  # every log line starts with its time


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
    connections, then waits for the open ones), so the app can drain its streams in time."""

    def __init__(self, config: uvicorn.Config, on_shutdown: Callable[[], None]) -> None:
        super().__init__(config)
        self.on_shutdown = on_shutdown

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

"""The uvicorn skeleton every BalanceRoute HTTP process runs: logging from the settings, a frozen
heap (the imports and models live as long as the process: shorter GC pauses), then uvicorn on
the settings' address until SIGINT or SIGTERM."""

from __future__ import annotations

import gc
import logging
from typing import Any

import uvicorn

from balanceroute.serving.http.settings import ServiceSettings


def configure_logging(settings: ServiceSettings) -> None:
    """The process's log level and format, from the settings."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:  %(message)s")


def serve(app: Any, settings: ServiceSettings, *, collect: bool = False, **options: Any) -> None:
    """Run ``app`` under uvicorn until stopped (``collect``: a full collection before the heap is
    frozen; ``options``: more uvicorn options)."""
    if collect:
        gc.collect()
    gc.freeze()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
        **options,
    )

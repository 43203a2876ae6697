"""Run the service: settings from flags and ``BALANCEROUTE_*``, then uvicorn until stopped."""

from __future__ import annotations

import gc
import logging

import uvicorn

from balanceroute.serving.service.app import create_app
from balanceroute.serving.service.settings import ServeSettings, load_serve_settings

__all__ = ["load_serve_settings", "run_server"]


def run_server(settings: ServeSettings) -> None:
    """Serve until stopped (models load in the background; see /readyz)."""
    logging.basicConfig(level=settings.log_level.upper(), format="%(levelname)s:  %(message)s")
    app = create_app(settings)
    gc.freeze()  # the imports live as long as the process (see app.py, first_load)
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=settings.access_log,
    )

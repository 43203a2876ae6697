"""Run the service: settings from flags and ``BALANCEROUTE_*``, then uvicorn until stopped."""

from __future__ import annotations

from balanceroute.serving.http.server import configure_logging, serve
from balanceroute.serving.service.app import create_app
from balanceroute.serving.service.settings import ServeSettings, load_serve_settings

__all__ = ["load_serve_settings", "run_server"]


def run_server(settings: ServeSettings) -> None:
    """Serve until stopped (models load in the background; see /readyz)."""
    configure_logging(settings)
    serve(create_app(settings), settings)  # the models load later (see app.py, first_load)

"""Run the service: settings from flags and ``BALANCEROUTE_*``, then uvicorn until stopped."""

from __future__ import annotations

import gc
import logging

import uvicorn
from pydantic import ValidationError

from balanceroute.features.errors import UserError
from balanceroute.serving.app import create_app
from balanceroute.serving.settings import ServeSettings


def load_settings(overrides: dict[str, object] | None = None) -> ServeSettings:
    """Settings from ``BALANCEROUTE_*`` and ``overrides``; invalid ones are one-line UserErrors."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        return ServeSettings(**given)
    except ValidationError as exc:
        raise UserError(
            "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
        ) from None


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

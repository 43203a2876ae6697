"""One router module per resource; :data:`ROUTERS` is what the app factory includes."""

from __future__ import annotations

from balanceroute.serving.service.routes import (
    admin,
    health,
    metrics,
    models,
    observe,
    predict,
    route,
)

ROUTERS = (
    health.router,
    predict.router,
    observe.router,
    route.router,
    models.router,
    admin.router,
    metrics.router,
)

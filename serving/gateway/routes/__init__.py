"""One router module per resource; :data:`ROUTERS` is what the gateway's app factory includes."""

from __future__ import annotations

from balanceroute.serving.gateway.routes import admin, front, metrics, openai, probes

ROUTERS = (probes.router, openai.router, admin.router, metrics.router, front.router)

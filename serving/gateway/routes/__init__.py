"""One router module per resource; :data:`ROUTERS` is what the gateway's app factory includes."""

from __future__ import annotations

from balanceroute.serving.gateway.routes import admin, group, probes

ROUTERS = (probes.router, admin.router, group.router)

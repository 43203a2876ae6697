"""Build a gateway from its settings (blocking: models load, estimators fit, services are
reached before anything listens) and serve it under uvicorn until SIGINT or SIGTERM, which
stops accepting and drains the streams in flight (:mod:`.drain`)."""

from __future__ import annotations

import os

import pandas as pd

from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.serving.gateway.app import create_gateway_app
from balanceroute.serving.gateway.arms import build_arms
from balanceroute.serving.gateway.runtime import UPSTREAM_KEY_ENV, Gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.tokens import PromptCounter
from balanceroute.serving.http.server import configure_logging, serve

GRACE_S = 3  # after the drain deadline: the cut streams' last events and the shutdown itself


def build_gateway(settings: GatewaySettings, group: LiveGroup | None = None) -> Gateway:
    """Everything the settings name, checked and loaded (UserErrors for what is wrong);
    ``group``: the live group to keep (default: a plain one)."""
    counter = PromptCounter(settings.tokenizer)
    history: pd.DataFrame | None = None
    if settings.history is not None:
        history, _ = load_workload(WorkloadSpec(trace=settings.history))
    arms = build_arms(settings, history)
    return Gateway(settings, arms, counter, upstream_key=os.environ.get(UPSTREAM_KEY_ENV) or None,
                   group=group)  # fmt: skip


def run_gateway(settings: GatewaySettings, gateway: Gateway | None = None) -> None:
    """Serve until stopped; the lifespan's end writes the completion log and the A/B files."""
    configure_logging(settings)
    gateway = gateway or build_gateway(settings)
    app = create_gateway_app(gateway)
    serve(app, settings, collect=True, on_shutdown=gateway.drain.begin,
          timeout_graceful_shutdown=int(settings.drain_timeout_s) + GRACE_S, backlog=4096)  # fmt: skip

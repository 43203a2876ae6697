"""The gateway's own app (probes, metrics, A/B, reload, models; the front passes those paths to
it on a Unix socket): the shared Host/Origin check and token, the routes, the lifespan."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from starlette.requests import ClientDisconnect

from balanceroute.serving.gateway import errors
from balanceroute.serving.gateway.routes import ROUTERS
from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.http.errors import client_disconnect
from balanceroute.serving.http.origin_check import OriginCheck

TITLE = "BalanceRoute gateway"
VERSION = "0.1.0"


def create_gateway_app(gateway: Gateway) -> FastAPI:
    """An app serving ``gateway``: started with the app, stopped (logs and results written)
    when the app shuts down."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await gateway.start()
        try:
            yield
        finally:
            saved = await gateway.stop()
            if saved is not None and saved.get("tracking_error"):
                print(f"balanceroute gateway: warning: MLflow: {saved['tracking_error']}")

    app = FastAPI(
        title=TITLE,
        version=VERSION,
        description="BalanceRoute in front of the data-parallel ranks of one decode group.",
        lifespan=lifespan,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = gateway.settings
    app.state.gateway = gateway
    # a non-JSON content type is vLLM's 400 (it cannot read such a body), not 415; the front
    # checks the body's size before it passes a request here
    app.add_middleware(OriginCheck, settings=gateway.settings, body=errors.refusal,
                       content_type_status=400)  # fmt: skip
    errors.install(app)
    app.add_exception_handler(ClientDisconnect, client_disconnect)
    for router in ROUTERS:
        app.include_router(router)
    return app

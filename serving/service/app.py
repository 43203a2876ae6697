"""The FastAPI application factory: settings, the model store, metrics, routers, errors."""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio.to_thread
import orjson
from fastapi import Depends, FastAPI, Response
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.openapi.utils import get_openapi
from starlette.requests import ClientDisconnect

from balanceroute.serving.http.errors import client_disconnect, validation_error
from balanceroute.serving.http.origin_check import OriginCheck
from balanceroute.serving.service.body import request_components
from balanceroute.serving.service.deps import require_token
from balanceroute.serving.service.metrics import MetricsMiddleware, ServiceMetrics
from balanceroute.serving.service.models import LoadedModel, ModelSlots, pin_lightgbm_threads
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.service.routes import ROUTERS
from balanceroute.serving.service.schemas import REQUEST_MODELS
from balanceroute.serving.service.settings import ServeSettings
from balanceroute.serving.service.snapshot import warm_router
from balanceroute.serving.service.twin_cache import RouteTwins

log = logging.getLogger("balanceroute.serve")
TITLE = "BalanceRoute"
VERSION = "0.1.0"


def add_docs(app: FastAPI) -> None:
    """``/openapi.json``, ``/docs`` and ``/redoc`` behind the bearer token (when one is set)."""
    token_required = [Depends(require_token)]

    @app.get("/openapi.json", include_in_schema=False, dependencies=token_required)
    async def openapi_json() -> Response:
        return Response(orjson.dumps(app.openapi()), media_type="application/json")

    @app.get("/docs", include_in_schema=False, dependencies=token_required)
    async def swagger() -> Response:
        return get_swagger_ui_html(openapi_url="/openapi.json", title=f"{TITLE} API")

    @app.get("/redoc", include_in_schema=False, dependencies=token_required)
    async def redoc() -> Response:
        return get_redoc_html(openapi_url="/openapi.json", title=f"{TITLE} API")


def _openapi(app: FastAPI) -> dict[str, Any]:
    """The generated document plus the schemas of the self-decoded request bodies."""
    if app.openapi_schema is None:
        doc = get_openapi(title=app.title, version=app.version, routes=app.routes)
        doc.setdefault("components", {}).setdefault("schemas", {}).update(
            request_components((*REQUEST_MODELS, RouteRequest))
        )
        app.openapi_schema = doc
    return app.openapi_schema


def create_app(settings: ServeSettings, *, store: ModelSlots | None = None) -> FastAPI:
    """A service for ``settings``; models load in the background after startup (see /readyz)."""
    metrics = ServiceMetrics()
    twins = RouteTwins()
    metrics.registry.register(twins.quality)  # the live prediction quality gauges

    def swapped(slot: str, old: LoadedModel | None, new: LoadedModel) -> None:
        metrics.swapped(slot, old, new)
        twins.drop(slot)  # the twin's verdict was about the old model

    if store is None:
        store = ModelSlots(
            settings.uris(),
            replay_buffer=settings.replay_buffer,
            inline_rows=settings.observe_inline_rows,
            on_swap=swapped,
            on_outcome=metrics.reloaded,
            after_load=lambda: pin_lightgbm_threads(settings.lightgbm_threads),
        )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async def warm() -> None:
            if not settings.warm_router:
                return
            try:
                await anyio.to_thread.run_sync(warm_router)
            except Exception:  # routing still works, the first call just pays the cost
                log.exception("router warm-up failed")

        async def first_load() -> None:
            await asyncio.gather(store.load_until_ready(settings.load_retry_s), warm())
            # What is loaded now lives as long as the process: out of the collector's sight, a
            # full collection (triggered by a large request's objects) takes milliseconds
            # instead of holding the interpreter, and every thread, for hundreds.
            gc.freeze()

        task = asyncio.create_task(first_load())
        twins.run()
        try:
            yield
        finally:
            if not task.done():
                task.cancel()
            twins.stop()

    app = FastAPI(
        title=TITLE,
        version=VERSION,
        description="Completion predictions and routing decisions for synchronized decode workers.",
        lifespan=lifespan,
        max_body_size=settings.max_body_bytes,
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.store = store
    app.state.metrics = metrics
    app.state.twins = twins
    app.add_middleware(OriginCheck, settings=settings)
    app.add_middleware(MetricsMiddleware, metrics=metrics)
    app.add_exception_handler(RequestValidationError, validation_error)
    app.add_exception_handler(ClientDisconnect, client_disconnect)
    for router in ROUTERS:
        app.include_router(router)
    add_docs(app)
    app.openapi = lambda: _openapi(app)  # type: ignore[method-assign]
    return app

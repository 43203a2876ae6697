"""One relay worker process (``python -m balanceroute.serving.gateway.split.worker``, started by
the decider): it accepts clients on the listening socket every worker shares, checks and counts
each completion request, asks the decider for a rank over the event line, and relays the stream
(:mod:`.lean`). Every other path (probes, ``/metrics``, ``/v1/ab``, ``/admin/reload``,
``/v1/models``) is passed whole to the decider's own app on its Unix socket.

Its settings, the listening socket's descriptor and the decider's two socket paths come from the
decider in :data:`SPEC_ENV` (JSON). SIGTERM drains its streams as the one-process gateway does;
if the decider goes away the worker stops too.
"""

from __future__ import annotations

import cProfile
import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import aiohttp
from fastapi import FastAPI, Request, Response
from starlette.requests import ClientDisconnect

from balanceroute.features.prompts import chat_text
from balanceroute.serving.gateway import errors
from balanceroute.serving.gateway.life import LiveRequest
from balanceroute.serving.gateway.routes.openai import _body
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.split import wire
from balanceroute.serving.gateway.split.channel import DeciderChannel
from balanceroute.serving.gateway.split.lean import LeanRelay, WorkerContext
from balanceroute.serving.gateway.tokens import PromptCounter, prompt_key
from balanceroute.serving.http.auth import Authorized
from balanceroute.serving.http.errors import client_disconnect
from balanceroute.serving.http.origin_check import OriginCheck
from balanceroute.serving.http.server import configure_logging, serve
from balanceroute.serving.openai.requests import ChatBody, CompletionBody
from balanceroute.serving.openai.responses import error_body

SPEC_ENV = "_BALANCEROUTE_RELAY_SPEC"  # not BALANCEROUTE_*: the settings never read it
PROFILE_ENV = "BALANCEROUTE_RELAY_PROFILE"  # benchmarks: cProfile each worker to PATH.relay-N
GRACE_S = 3
HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host"}
JSON = "application/json"


def create_worker_app(ctx: WorkerContext, counter: PromptCounter, control: str) -> FastAPI:
    """The worker's app: the two completion routes, everything else passed to the decider."""
    settings = ctx.settings
    passthrough: dict[str, aiohttp.ClientSession] = {}

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=60, force_close=False)
        timeout = aiohttp.ClientTimeout(total=settings.request_timeout_s,
                                        sock_connect=settings.connect_timeout_s)  # fmt: skip
        ctx.session = aiohttp.ClientSession(connector=connector, timeout=timeout,
                                            auto_decompress=False)  # fmt: skip
        passthrough["s"] = aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=control),
                                                 auto_decompress=False)  # fmt: skip
        await ctx.channel.open()
        try:
            yield
        finally:
            await ctx.channel.close()
            await passthrough["s"].close()
            await ctx.session.close()

    app = FastAPI(title="BalanceRoute relay worker", lifespan=lifespan, openapi_url=None,
                  docs_url=None, redoc_url=None)  # fmt: skip
    app.state.settings = settings
    app.add_middleware(OriginCheck, settings=settings, body=errors.refusal,
                       content_type_status=400)  # fmt: skip
    app.add_middleware(errors.BodyLimit, max_bytes=settings.max_body_bytes)
    errors.install(app)
    app.add_exception_handler(ClientDisconnect, client_disconnect)

    def queue(request: Request, data: dict[str, Any], prompt: Any, body: Any,
              chat: bool) -> Response:  # fmt: skip
        if ctx.drain.draining or ctx.channel.lost:
            body_ = error_body(503, "the gateway is shutting down")
            return Response(body_, 503, {"retry-after": "1", "connection": "close"},
                            media_type=JSON)  # fmt: skip
        tokens, _ = counter.count(prompt)
        key, key_hash = prompt_key(prompt)
        channel = ctx.channel
        rid = channel.new_id()
        request_id = request.headers.get("x-request-id") or f"gw-{os.urandom(8).hex()}"
        options = body.stream_options
        now = ctx.clock()
        req = LiveRequest(
            request_id=request_id, path=request.url.path, chat=chat, body=data,
            stream=body.stream, usage=bool(options and options.include_usage),
            continuous=bool(options and options.continuous_usage_stats), prompt_tokens=tokens,
            prompt_key=key, arrival=now, arrival_epoch=0.0, position=-1,
            admitted=channel.admission(rid),
        )  # fmt: skip
        channel.send(wire.ADMIT, rid, tokens, key_hash, key, request_id, bool(body.stream))
        return LeanRelay(ctx, req, rid)

    @app.post("/v1/completions", dependencies=[Authorized])
    async def completions(request: Request) -> Response:
        data, body = await _body(request, CompletionBody)
        return queue(request, data, body.single_prompt(), body, False)

    @app.post("/v1/chat/completions", dependencies=[Authorized])
    async def chat_completions(request: Request) -> Response:
        data, body = await _body(request, ChatBody)
        return queue(request, data, chat_text(data["messages"]), body, True)

    @app.api_route("/{path:path}", methods=["GET", "POST", "PUT", "DELETE", "PATCH", "HEAD"])
    async def to_decider(request: Request, path: str) -> Response:
        """Anything else is the decider's: passed whole to its app."""
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
        url = "http://127.0.0.1" + request.url.path  # a loopback Host: the decider checks it
        if request.url.query:
            url += "?" + request.url.query
        try:
            async with passthrough["s"].request(request.method, url, headers=headers,
                                                data=await request.body()) as resp:  # fmt: skip
                content = await resp.read()
                out = {k: v for k, v in resp.headers.items() if k.lower() not in HOP}
                return Response(content, resp.status, out)
        except (aiohttp.ClientError, OSError) as exc:
            return Response(error_body(503, f"the gateway's decider does not answer: {exc}"), 503,
                            media_type=JSON)  # fmt: skip

    return app


def run_worker(spec: dict[str, Any]) -> None:
    """Serve on the shared listening socket until SIGTERM (or the decider goes away)."""
    settings = GatewaySettings.model_validate(spec["settings"])
    configure_logging(settings)
    channel = DeciderChannel(spec["events"], lambda: os.kill(os.getpid(), signal.SIGTERM))
    ctx = WorkerContext(settings, channel, spec.get("upstream_key"))
    app = create_worker_app(ctx, PromptCounter(settings.tokenizer), spec["control"])
    serve(app, settings, collect=True, fd=int(spec["fd"]),
          on_shutdown=ctx.drain.begin, backlog=4096,
          timeout_graceful_shutdown=int(settings.drain_timeout_s) + GRACE_S)  # fmt: skip


def main() -> None:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    profile = os.environ.get(PROFILE_ENV)
    if not profile:
        run_worker(spec)
        return
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(SystemExit(0)))
    prof = cProfile.Profile()
    try:
        prof.runcall(run_worker, spec)
    except SystemExit:
        pass
    finally:
        prof.dump_stats(f"{profile}.relay-{spec['index']}")


if __name__ == "__main__":
    main()

"""A tiny app served by the project's uvicorn skeleton (``serve``), for the deadline tests:
``python -m tests.serving.http.deadline_app PORT`` with the deadlines in ``BALANCEROUTE_*``."""

from __future__ import annotations

import asyncio
import sys

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse, StreamingResponse
from starlette.routing import Route

from balanceroute.serving.http.server import serve
from balanceroute.serving.http.settings import ServiceSettings

CHUNKS = 6
CHUNK_GAP_S = 0.5


async def ok(_: Request) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def echo(request: Request) -> PlainTextResponse:
    return PlainTextResponse(str(len(await request.body())))


async def slow(_: Request) -> StreamingResponse:
    """An answer streamed for longer than every deadline (it must not be cut)."""

    async def chunks():
        for i in range(CHUNKS):
            await asyncio.sleep(CHUNK_GAP_S)
            yield f"chunk {i}\n"

    return StreamingResponse(chunks(), media_type="text/plain")


app = Starlette(routes=[Route("/ok", ok), Route("/echo", echo, methods=["POST"]),
                        Route("/slow", slow)])  # fmt: skip

if __name__ == "__main__":
    serve(app, ServiceSettings(port=int(sys.argv[1]), log_level="warning"))

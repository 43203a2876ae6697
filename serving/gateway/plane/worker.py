"""One Protocol relay worker process (``python -m balanceroute.serving.gateway.plane.worker``,
started by the split gateway's decider, :mod:`..split.decider`): it accepts clients on the
listening socket every worker shares (:mod:`.front`) and moves their streams (:mod:`.exchange`),
on uvloop.

Its settings, the listening socket's descriptor and the decider's two socket paths come from the
decider in :data:`~balanceroute.serving.gateway.split.worker.SPEC_ENV` (JSON), as the aiohttp
worker's do. SIGTERM drains: it stops accepting, new requests on open connections get 503, the
streams in flight get ``drain_timeout_s`` to finish and then end with an SSE error event (or a
503 before their first token). If the decider goes away the worker drains and exits too.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import socket
from typing import Any

import uvloop

from balanceroute.serving.gateway.plane.front import Connection, Front
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.split.channel import DeciderChannel
from balanceroute.serving.gateway.split.lean import WorkerContext
from balanceroute.serving.gateway.split.worker import SPEC_ENV
from balanceroute.serving.gateway.tokens import PromptCounter
from balanceroute.serving.http.server import configure_logging

GRACE_S = 3.0  # after the drain deadline, for the ended answers to be written


async def serve(spec: dict[str, Any], settings: GatewaySettings) -> None:
    """Accept and relay until SIGTERM or SIGINT (or the decider goes away), then drain."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    channel = DeciderChannel(spec["events"], stop.set)
    ctx = WorkerContext(settings, channel, spec.get("upstream_key"))
    front = Front(ctx, PromptCounter(settings.tokenizer), spec["control"])
    await channel.open()
    listener = socket.socket(fileno=int(spec["fd"]))
    server = await loop.create_server(lambda: Connection(front), sock=listener, backlog=4096)
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gc.collect()
    gc.freeze()  # the imports and models live as long as the process: shorter GC pauses
    await stop.wait()
    server.close()
    ctx.drain.begin()
    front.close_idle()
    over = loop.create_task(ctx.drain.over.wait())
    quiet = loop.create_task(front.idle.wait())
    await asyncio.wait({over, quiet}, return_when=asyncio.FIRST_COMPLETED)
    if not front.idle.is_set():
        front.drain_over()
        try:
            await asyncio.wait_for(front.idle.wait(), GRACE_S)
        except TimeoutError:
            pass
    over.cancel()
    quiet.cancel()
    front.pool.close()
    await channel.close()


def main() -> None:
    spec = json.loads(os.environ.pop(SPEC_ENV))
    settings = GatewaySettings.model_validate(spec["settings"])
    configure_logging(settings)
    uvloop.run(serve(spec, settings))


if __name__ == "__main__":
    main()

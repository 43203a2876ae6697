"""One relay worker process (``python -m balanceroute.serving.gateway.plane.worker``, started by
the launcher for ``balanceroute gateway --relay-workers N``): it accepts clients on the
listening socket every worker shares (:mod:`.front`), moves their streams (:mod:`.exchange`) on
uvloop, and reaches the decider through its proxy (:mod:`.wire`).

Its settings (the API token and the upstream key among them), the listening socket's descriptor
and the decider's two socket paths come from the launcher as JSON on its standard input, never
in its environment. SIGTERM drains: it stops accepting, new requests on open
connections get 503, the streams in flight get ``drain_timeout_s`` to finish and then end with
an SSE error event (or a 503 before their first token). If the decider goes away the worker
drains and exits too.
"""

from __future__ import annotations

import asyncio
import gc
import json
import signal
import socket
import sys
from typing import Any

import uvloop

from balanceroute.features.prompts import PromptCounter
from balanceroute.serving.gateway.plane.front import Front
from balanceroute.serving.gateway.plane.request import PlaneContext
from balanceroute.serving.gateway.plane.wire import DeciderProxy
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.http.server import configure_logging

GRACE_S = 3.0  # after the drain deadline, for the ended answers to be written


async def serve(spec: dict[str, Any], settings: GatewaySettings) -> None:
    """Accept and relay until SIGTERM or SIGINT (or the decider goes away), then drain."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    proxy = DeciderProxy(spec["events"], stop.set)
    ctx = PlaneContext(settings, proxy, spec.get("upstream_key"))
    front = Front(ctx, PromptCounter(settings.tokenizer), control=spec["control"])
    await proxy.open()
    await front.listen(sock=socket.socket(fileno=int(spec["fd"])))
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    gc.collect()
    gc.freeze()  # the imports and models live as long as the process: shorter GC pauses
    await stop.wait()
    front.begin_drain()
    await front.drained(GRACE_S)
    await proxy.close()


def main() -> None:
    """The worker's entry point: its spec from standard input, then :func:`serve`."""
    spec = json.loads(sys.stdin.buffer.read())
    settings = GatewaySettings.model_validate(spec["settings"])
    configure_logging(settings)
    uvloop.run(serve(spec, settings))


if __name__ == "__main__":
    main()

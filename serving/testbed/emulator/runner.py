"""The emulator process: one asyncio loop, one decode group, G uvicorn servers (one port a rank).

This is how vLLM's external data-parallel load balancing looks from outside: one API server per
``--data-parallel-rank``, each on its own port, all ranks stepping in lockstep. Ports are bound
before anything starts, so a busy port is a one-line error. SIGINT or SIGTERM stops the servers,
ends every open response, and writes the logs (``DIR/config.json``, the iteration and request
parts, ``DIR/summary.json``).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import numpy as np
import uvicorn

from balanceroute.features.errors import UserError
from balanceroute.features.files import write_json
from balanceroute.serving.testbed.emulator.app import create_rank_app
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.group import DecodeGroup
from balanceroute.serving.testbed.emulator.iterlog import IterationLog


def bind_sockets(host: str, ports: list[int]) -> list[socket.socket]:
    """Bind every port now (all or none), so a busy port fails before anything serves."""
    bound: list[socket.socket] = []
    try:
        for port in ports:
            family = socket.AF_INET6 if ":" in host else socket.AF_INET
            sock = socket.socket(family, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((host, port))
            except OSError as exc:
                sock.close()
                raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
            sock.set_inheritable(True)
            bound.append(sock)
    except BaseException:
        for s in bound:
            s.close()
        raise
    return bound


def _server(app: Any) -> uvicorn.Server:
    config = uvicorn.Config(
        app,
        lifespan="off",
        log_level="warning",
        access_log=False,
        http="httptools",
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
        backlog=4096,
    )
    return uvicorn.Server(config)


async def serve(config: EmulatorConfig, ready: Callable[[str], None] | None = None) -> None:
    """Serve until SIGINT or SIGTERM."""
    log = IterationLog(config.log_dir, config.ranks)
    sockets = bind_sockets(config.host, config.ports())
    group = DecodeGroup(config, log)
    if log.dir is not None:
        write_json(log.dir / "config.json", {**config.as_dict(), "epoch": group.epoch})
    servers = [_server(create_rank_app(group, g)) for g in range(config.ranks)]
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    clock = loop.create_task(group.run(), name="decode-group")
    tasks = [
        loop.create_task(s._serve(sockets=[sock]), name=f"rank-{g}")
        for g, (s, sock) in enumerate(zip(servers, sockets, strict=True))
    ]
    while not all(s.started for s in servers):
        if any(t.done() for t in tasks):
            break
        await asyncio.sleep(0.01)
    gc.collect()
    gc.freeze()  # the long-lived objects of startup are never scanned again: shorter pauses
    if ready is not None:
        ready(
            f"emulating {config.ranks} ranks x {config.slots} slots "
            f"({config.cost_name}, time scale {config.time_scale:g}) on "
            f"{config.urls()[0]} .. :{config.ports()[-1]}"
        )
    waiters = [loop.create_task(stop.wait()), clock, *tasks]
    await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    for s in servers:
        s.should_exit = True
    crashed = clock.done() and not clock.cancelled() and clock.exception() is not None
    if crashed:  # a bug, never bad input: say so loudly, then shut down cleanly
        traceback.print_exception(clock.exception(), file=sys.stderr)
    clock.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await clock
    group.abort_all()
    await asyncio.gather(*tasks, return_exceptions=True)
    await group.flush()
    for s in sockets:
        s.close()
    if log.dir is not None:
        write_json(
            log.dir / "summary.json",
            {
                "iterations": group.k,
                "accepted": group.accepted,
                "resyncs": group.resyncs,
                "model_time_s": group.model_end,
                "wall_time_s": time.perf_counter() - group.t0,
            },
        )
    if crashed:
        raise SystemExit(1)


def _print_ready(line: str) -> None:
    print(line, flush=True)


def exec_emulator(config: EmulatorConfig) -> None:
    """Replace this process (same pid) with a lean ``python -m balanceroute.serving.testbed.emulator``
    running ``config``: the CLI has imported every other command's dependencies."""
    sys.stdout.flush()
    sys.stderr.flush()
    args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator", json.dumps(config.as_dict())]
    os.execv(sys.executable, args)


def run_emulator(config: EmulatorConfig) -> None:
    """Run the emulator in this process (uvloop when installed) until stopped."""
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    np.seterr(all="ignore")
    try:
        import uvloop

        factory: Callable[[], asyncio.AbstractEventLoop] | None = uvloop.new_event_loop
    except ImportError:  # pragma: no cover - uvloop is a dependency off Windows
        factory = None
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(serve(config, ready=_print_ready))
    sys.stdout.flush()

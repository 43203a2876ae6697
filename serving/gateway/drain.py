"""The gateway's shutdown drain: on SIGTERM (or SIGINT) uvicorn stops accepting connections and
:meth:`Drain.begin` starts the clock; the streams in flight get ``drain_timeout_s`` to finish,
then :attr:`Drain.over` is set and each relay still running ends its answer itself (an SSE
error event and ``[DONE]``, or a 503 before the first token), so no stream is cut silently and
no task is left for uvicorn to cancel."""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger("balanceroute.gateway")


class Drain:
    """Whether the gateway is shutting down, and when the drain deadline has passed."""

    def __init__(self, timeout_s: float, announce: bool = True) -> None:
        self.timeout_s = timeout_s
        self.announce = announce  # False in a relay worker: the decider logs the one line
        self.draining = False
        self.over = asyncio.Event()

    def begin(self) -> None:
        """Shutdown began: new requests get 503; :attr:`over` is set after ``timeout_s``."""
        if self.draining:
            return
        self.draining = True
        if self.announce:
            log.warning("shutting down: the streams in flight get %g s to finish", self.timeout_s)
        asyncio.get_running_loop().call_later(self.timeout_s, self.over.set)

"""uvicorn's httptools protocol with a deadline on receiving a request, which uvicorn lacks.

uvicorn's ``timeout_keep_alive`` closes a connection idle *between* requests, but it is reset by
every byte received and nothing bounds the time a request takes to arrive: a client sending its
headers one byte a second (slowloris) holds a connection, and its memory, for ever. Here a
connection gets ``header_timeout_s`` from its opening (or, on a kept-alive connection, from the
first byte of the next request) to the end of the request's headers, then ``body_timeout_s``
more for the body. A connection that misses the header deadline gets 408 and is closed; one that
misses the body deadline is closed (the app sees the client disconnect). Once a request has
fully arrived nothing here applies: a long streamed answer is never cut.

It also bounds a request's head (request line and headers: uvicorn's httptools protocol has no
limit): over :data:`HEAD_LIMIT` bytes the client gets 431 and the connection is closed as soon as
that much has arrived, before the parser buffers more (h11 and nginx do the same). The answer is
followed by a lingering close (:func:`linger`): what the client still sends is read and dropped
for a moment, so that it reads the 431 rather than a reset.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

log = logging.getLogger("balanceroute.http")

_MESSAGE = b"the request did not arrive in time"
HEAD_LIMIT = 64 * 1024  # the most bytes a request's line and headers may take
_TOO_LARGE = b"the request's head is over %d bytes" % HEAD_LIMIT
HEAD_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_TOO_LARGE), _TOO_LARGE)
)
REQUEST_TIMEOUT = (
    b"HTTP/1.1 408 Request Timeout\r\ncontent-type: text/plain; charset=utf-8\r\n"
    b"content-length: %d\r\nconnection: close\r\n\r\n%s" % (len(_MESSAGE), _MESSAGE)
)


LINGER_S = 2.0  # how long a refused client's further bytes are read and dropped


def linger(transport: asyncio.Transport) -> None:
    """Close after an answer the client may not wait for: end our side now (its buffered answer
    first), and the connection after :data:`LINGER_S` (the caller drops what arrives meanwhile);
    closing at once with its bytes unread would reset the connection and lose the answer."""
    if transport.can_write_eof():
        transport.write_eof()
    asyncio.get_running_loop().call_later(LINGER_S, transport.close)


class DeadlineProtocol(HttpToolsProtocol):
    """HttpToolsProtocol whose requests must arrive within the class's deadlines (a subclass
    made by :func:`deadline_protocol` sets them)."""

    header_timeout_s: float = 10.0
    body_timeout_s: float = 60.0

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline: asyncio.TimerHandle | None = None
        self._headers_done = False
        self._head_bytes = 0  # received since the request began, until its headers end
        self._dropping = False  # refused: what arrives is dropped until the close

    def _arm(self, seconds: float) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, self._expired)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _expired(self) -> None:
        """The request did not arrive in time: 408 if its headers had not, then close."""
        self._deadline = None
        if self.transport.is_closing():
            return
        if not self._headers_done and self.cycle is not None and not self.cycle.response_complete:
            self._arm(self.header_timeout_s)  # the next request behind an answer: never cut it
            return
        stage = "body" if self._headers_done else "headers"
        log.warning("closing a connection from %s: its request %s did not arrive within %.0f s",
                    self.client, stage,
                    self.body_timeout_s if self._headers_done else self.header_timeout_s)  # fmt: skip
        if not self._headers_done:
            self.transport.write(REQUEST_TIMEOUT)
        self.transport.close()

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm(self.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._dropping:
            return
        if not self._headers_done:
            self._head_bytes += len(data)
        super().data_received(data)
        if self._headers_done or self._head_bytes <= HEAD_LIMIT or self.transport.is_closing():
            return
        log.warning("closing a connection from %s: its request's head is over %d bytes",
                    self.client, HEAD_LIMIT)  # fmt: skip
        self._disarm()
        self._dropping = True
        self.transport.write(HEAD_TOO_LARGE)
        linger(self.transport)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._headers_done = False
        if self._deadline is None:  # a kept-alive connection: the clock starts at its first byte
            self._arm(self.header_timeout_s)

    def on_headers_complete(self) -> None:
        self._headers_done = True
        self._head_bytes = 0
        self._arm(self.body_timeout_s)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        self._headers_done = False  # what follows is the next request's head
        super().on_message_complete()


def deadline_protocol(header_timeout_s: float, body_timeout_s: float) -> type[DeadlineProtocol]:
    """A :class:`DeadlineProtocol` class with these deadlines, for uvicorn's ``http`` option."""
    return type("DeadlineProtocol", (DeadlineProtocol,),
                {"header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s})  # fmt: skip

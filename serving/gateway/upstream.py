"""Kept-alive HTTP/1.1 connections to the ranks, one request at a time each, parsed by
httptools: the request is written whole, and the response's status and body pieces go to the
request's :class:`Sink` as they are read (the body already un-chunked). A connection whose
response ended cleanly and that the rank keeps alive goes back to its rank's idle list.

Once a stream's first token has reached its client, the rest of its answer is parsed at the end
of each pass of the event loop (:meth:`RankPool.later`): first tokens and new requests go first.

Closing a connection is how a request is cancelled on the rank (vLLM and the emulator abort a
request whose client went away), so a request that ends early closes its connection.

The decider's own small reads of a rank (``GET /health``, ``GET /metrics`` for the step counter)
go over the same kept-alive connections (:meth:`RankPool.get`): a few tens of microseconds of
CPU each, where an aiohttp request costs several times that, and at load they run every second
for every rank.
"""

from __future__ import annotations

import asyncio
from typing import Protocol
from urllib.parse import urlsplit

import httptools

from balanceroute.serving.gateway.settings import GatewaySettings


class Sink(Protocol):
    """What a request's exchange hears from its upstream connection."""

    def head(self, status: int) -> None: ...

    def body(self, data: bytes) -> None: ...

    def complete(self) -> None: ...

    def broken(self, why: str) -> None: ...


class Whole:
    """A :class:`Sink` that collects a whole answer into ``done``: ``(status, body)``, or a
    ConnectionError naming why the connection broke."""

    def __init__(self, done: asyncio.Future[tuple[int, bytes]]) -> None:
        self.done = done
        self.status = 0
        self.parts: list[bytes] = []

    def head(self, status: int) -> None:
        self.status = status

    def body(self, data: bytes) -> None:
        self.parts.append(data)

    def complete(self) -> None:
        if not self.done.done():
            self.done.set_result((self.status, b"".join(self.parts)))

    def broken(self, why: str) -> None:
        if not self.done.done():
            self.done.set_exception(ConnectionError(why))


class Upstream(asyncio.Protocol):
    """One connection to a rank (module docstring)."""

    def __init__(self, pool: RankPool, rank: int) -> None:
        self.pool = pool
        self.rank = rank
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.sink: Sink | None = None
        self.busy = False  # a response is still due (the sink may have let go of it)
        self.heard = False  # a byte of the current response arrived
        self.closed = False
        self.relaying = False  # the answer streams to its client: pieces are relayed later

    # ---- asyncio ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.heard = True
        if self.relaying:  # a stream's later pieces wait for the loop pass's new work
            self.pool.later(self, data)
            return
        self.feed(data)

    def feed(self, data: bytes) -> None:
        """Bytes of the answer, parsed now."""
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(f"the rank's answer is not HTTP: {exc}")
            self.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self.pool.relay_pending()  # what was read before the loss is the answer's, in order
        self.closed = True
        self.pool.forget(self)
        self._fail(f"the connection closed ({exc or 'by the rank'})")

    # ---- httptools -------------------------------------------------------------------------
    def on_headers_complete(self) -> None:
        if self.sink is not None:
            self.sink.head(self.parser.get_status_code())

    def on_body(self, body: bytes) -> None:
        if self.sink is not None:
            self.sink.body(body)

    def on_message_complete(self) -> None:
        sink, self.sink = self.sink, None
        self.busy = self.relaying = False
        if self.parser.should_keep_alive() and not self.closed:
            self.pool.put(self)
        else:
            self.close()
        if sink is not None:
            sink.complete()

    # ---- the exchange's side ---------------------------------------------------------------
    def send(self, sink: Sink, request: bytes) -> None:
        """Write one whole request; its answer goes to ``sink``."""
        assert self.transport is not None
        self.sink, self.busy, self.heard, self.relaying = sink, True, False, False
        self.transport.write(request)

    def release(self) -> None:
        """The exchange has what it needs: the rest of the answer is read and dropped, then the
        connection is reused."""
        self.sink = None
        if not self.busy and not self.closed:
            self.pool.put(self)

    def pause(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.pause_reading()

    def resume(self) -> None:
        if self.transport is not None and not self.closed:
            self.transport.resume_reading()

    def close(self) -> None:
        """Close the connection (a request on it is cancelled on the rank)."""
        self.sink = None
        self.closed = True
        self.pool.forget(self)
        if self.transport is not None:
            self.transport.close()

    def _fail(self, why: str) -> None:
        sink, self.sink = self.sink, None
        if sink is not None:
            sink.broken(why)


class RankPool:
    """Each rank's idle kept-alive connections, and new ones when none is idle."""

    def __init__(self, settings: GatewaySettings, *, spares: bool = False) -> None:
        self.settings = settings
        self.idle: dict[int, list[Upstream]] = {}
        self.where: dict[int, tuple[str, int, str, bytes]] = {}
        self.pending: list[tuple[Upstream, bytes]] = []  # streams' pieces read this loop pass
        self.spares = spares  # keep one idle connection ready per rank in use
        self.opening: dict[int, asyncio.Task] = {}  # a spare being opened, per rank
        self.closed = False

    def later(self, up: Upstream, data: bytes) -> None:
        """A streaming answer's piece, relayed after the other work of this pass of the event
        loop: the ranks' pieces arrive together at each iteration's end, and a first token or
        a new request is handled before the running streams' next tokens (their next is due
        an iteration later), so a request's first token does not wait behind the group's."""
        self.pending.append((up, data))
        if len(self.pending) == 1:
            asyncio.get_running_loop().call_soon(self.relay_pending)

    def relay_pending(self) -> None:
        """Relay the pieces read this pass, in the order they were read."""
        pending, self.pending = self.pending, []
        for up, data in pending:
            up.feed(data)

    def address(self, rank: int) -> tuple[str, int, str, bytes]:
        """``rank``'s host, port, path prefix and ``Host`` header value."""
        found = self.where.get(rank)
        if found is None:
            url = urlsplit(self.settings.rank_url(rank))
            port = url.port or (443 if url.scheme == "https" else 80)
            found = (url.hostname or "127.0.0.1", port, url.path.rstrip("/"), url.netloc.encode())
            self.where[rank] = found
        return found

    def idle_connection(self, rank: int) -> Upstream | None:
        """One of ``rank``'s idle kept-alive connections that is still open, or None (with
        ``spares``, taking the last one opens another in the background: the next request to
        the rank is written at once instead of waiting for a connection)."""
        idle = self.idle.get(rank)
        found = None
        while idle:
            up = idle.pop()
            if not up.closed and up.transport is not None and not up.transport.is_closing():
                found = up
                break
        if self.spares and not idle and rank not in self.opening and not self.closed:
            self.opening[rank] = asyncio.get_running_loop().create_task(self._spare(rank))
        return found

    async def connect(self, rank: int) -> tuple[Upstream, bool]:
        """A connection to ``rank`` (an idle one first) and whether it was reused; OSError or
        TimeoutError when a new one cannot be made within ``connect_timeout_s``."""
        up = self.idle_connection(rank)
        if up is not None:
            return up, True
        return await self._open(rank), False

    async def _open(self, rank: int) -> Upstream:
        host, port, _, _ = self.address(rank)
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(self.settings.connect_timeout_s):
            _, up = await loop.create_connection(lambda: Upstream(self, rank), host, port)
        return up

    async def _spare(self, rank: int) -> None:
        """An idle connection to ``rank`` for its next request (a rank that cannot be reached
        is the requests' and the health checks' to find out)."""
        try:
            up = await self._open(rank)
        except (OSError, TimeoutError):
            return
        finally:
            self.opening.pop(rank, None)
        if self.closed:
            up.close()
        else:
            self.put(up)

    async def get(self, rank: int, path: str, headers: dict[str, str] | None = None,
                  timeout_s: float = 2.0) -> tuple[int, bytes]:  # fmt: skip
        """``GET path`` of ``rank`` over a kept-alive connection: ``(status, body)``; OSError
        when the rank cannot be reached or answers no HTTP, TimeoutError after ``timeout_s``
        (the connection is then closed)."""
        _, _, prefix, host = self.address(rank)
        lines = [b"GET " + (prefix + path).encode() + b" HTTP/1.1", b"host: " + host]
        lines += [k.encode("latin-1") + b": " + v.encode("latin-1")
                  for k, v in (headers or {}).items()]  # fmt: skip
        request = b"\r\n".join(lines) + b"\r\n\r\n"
        loop = asyncio.get_running_loop()
        async with asyncio.timeout(timeout_s):
            while True:
                up, reused = await self.connect(rank)
                done: asyncio.Future[tuple[int, bytes]] = loop.create_future()
                up.send(Whole(done), request)
                try:
                    return await done
                except ConnectionError:
                    if reused and not up.heard:  # a kept-alive connection the rank closed
                        continue
                    raise
                except BaseException:  # timed out or cancelled: the answer is not awaited
                    up.close()
                    raise

    def put(self, up: Upstream) -> None:
        idle = self.idle.setdefault(up.rank, [])
        if up not in idle:
            idle.append(up)

    def forget(self, up: Upstream) -> None:
        idle = self.idle.get(up.rank)
        if idle and up in idle:
            idle.remove(up)

    def close(self) -> None:
        self.closed = True
        for task in list(self.opening.values()):
            task.cancel()
        for idle in list(self.idle.values()):
            for up in list(idle):
                up.close()
        self.idle.clear()

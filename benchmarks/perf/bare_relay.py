"""The floor of a Python relay on this machine: the fewest steps a relay written as the gateway's
data plane is (uvloop, httptools, kept-alive connections to the ranks) can take, and nothing
else: requests round robin to the ranks, the rank's answer relayed byte for byte. No body check,
no count, no decision, no metrics. ``side_by_side.py --floor`` runs it as the arm ``floor``: its
added TTFT over the peers is what any Python relay pays here before the gateway does its work.

    .venv/bin/python benchmarks/perf/bare_relay.py --port 8100 --rank http://127.0.0.1:9000 ...
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
from urllib.parse import urlsplit

import httptools
import uvloop

HOP = {b"host", b"connection", b"keep-alive"}


class Upstream(asyncio.Protocol):
    """A kept-alive connection to one rank; relays one answer at a time to ``client``."""

    def __init__(self, idle: list[Upstream]) -> None:
        self.idle = idle
        self.parser = httptools.HttpResponseParser(self)
        self.transport: asyncio.Transport | None = None
        self.client: Client | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        if self.client is not None:
            self.client.transport.write(data)
        self.parser.feed_data(data)

    def on_message_complete(self) -> None:
        self.client = None
        self.idle.append(self)

    def connection_lost(self, exc: Exception | None) -> None:
        if self in self.idle:
            self.idle.remove(self)
        if self.client is not None:
            self.client.transport.close()


class Client(asyncio.Protocol):
    """One client connection: each request forwarded to the next rank in turn."""

    def __init__(self, ranks: list[tuple[str, int, list[Upstream]]], turn: itertools.cycle) -> None:
        self.ranks, self.turn = ranks, turn
        self.parser = httptools.HttpRequestParser(self)
        self.transport: asyncio.Transport = None  # type: ignore[assignment]
        self.url, self.headers, self.body = b"", [b""], bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        self.parser.feed_data(data)

    def on_message_begin(self) -> None:
        self.url, self.headers, self.body = b"", [b""], bytearray()

    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        if name.lower() not in HOP:
            self.headers.append(name + b": " + value)

    def on_body(self, body: bytes) -> None:
        self.body += body

    def on_message_complete(self) -> None:
        method = self.parser.get_method()
        if self.url == b"/health":
            self.transport.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
            return
        host, port, idle = self.ranks[next(self.turn)]
        self.headers[0] = method + b" " + self.url + b" HTTP/1.1\r\nhost: " + host.encode()
        request = b"\r\n".join(self.headers) + b"\r\n\r\n" + bytes(self.body)
        if idle:
            up = idle.pop()
            up.client = self
            assert up.transport is not None
            up.transport.write(request)
            return
        asyncio.get_running_loop().create_task(self._connect(host, port, idle, request))

    async def _connect(self, host: str, port: int, idle: list[Upstream], request: bytes) -> None:
        loop = asyncio.get_running_loop()
        _, up = await loop.create_connection(lambda: Upstream(idle), host, port)
        up.client = self
        assert up.transport is not None
        up.transport.write(request)


async def serve(port: int, ranks: list[str]) -> None:
    targets = []
    for r in ranks:
        u = urlsplit(r)
        targets.append((u.hostname or "127.0.0.1", u.port or 80, []))
    turn = itertools.cycle(range(len(targets)))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(targets, turn), "127.0.0.1", port)
    async with server:
        await server.serve_forever()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--rank", action="append", required=True)
    args = p.parse_args()
    uvloop.run(serve(args.port, args.rank))


if __name__ == "__main__":
    main()

"""The decider's methods across a Unix socket, for relay worker processes: each call one JSON
array on a line, a handful per request (never one per chunk). :class:`DeciderProxy` is the
decider as a worker sees it (it encodes each call); :class:`Links` is the decider's side (it
decodes each line into the same call on the :class:`~..decider.Decider`).

Worker to decider (``rid``: the worker's own request number):

- ``[ADMIT, rid, prompt_tokens, key_hash, key, request_id, stream]``: :meth:`~..decider.Decider.admit`;
- ``[FIRST, rid, t]``: its first token reached the worker at monotonic time ``t``;
- ``[FINISH, rid, rank, first_t, last_t, output_tokens, prompt_tokens, finish_reason]``;
- ``[SUSPECT, rid, rank, why]`` / ``[REFUSED, rid, rank, status]``: the rank failed it before
  its first token (or refused the gateway's key);
- ``[REQUEUE, rid, rank, last]``: route it again (the decider answers ``ASSIGN``);
- ``[ABANDON, rid, outcome]``: it ended otherwise (``outcome`` counted when not null);
- ``[COUNT, 0, outcome]``: an outcome to count, nothing else.

Decider to worker: ``[ASSIGN, rid, rank]`` (rank -1: no rank, give up) and
``[REJECT, rid, status, message]`` (pool full: 429; no rank in rotation or draining: 503).
Both sides' times are ``time.monotonic()``, one clock per machine. A worker whose line ends has
every request it held abandoned at once (counted ``relay_lost``: their slots are free for the
next decision); a worker that loses the decider answers its waiting requests 503.

The decider's socket takes lines from its own workers only (their pids, checked with
``SO_PEERCRED``), and a ``FINISH`` whose values are not plausible for the request (another
rank, times outside its life, more tokens than :data:`MAX_RATE` allows) is not logged: the
request leaves as ``implausible``.

What a client controls is bounded before it reaches a line (the prompt key's words, the request
id), and an admission whose line would still be over :data:`LIMIT` is refused to its client
(413) without being sent. A line over the limit, or one that is not an event, is skipped and
logged: a bad event fails one request at most, never the link and the requests it carries.
"""

from __future__ import annotations

import asyncio
import logging
import math
import socket
import struct
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from balanceroute.serving.gateway.decider import RELAY_LOST, Decider, Rejected

log = logging.getLogger("balanceroute.gateway")
ADMIT, FIRST, FINISH, SUSPECT, REFUSED, REQUEUE, ABANDON, COUNT = range(8)
ASSIGN, REJECT = 100, 101
LIMIT = 1 << 20  # the longest line either side accepts (an admission carries its prompt key)
GONE = "the gateway's decider is gone"
MAX_RATE, BURST = 10_000.0, 4096  # a plausible FINISH: tokens <= BURST + MAX_RATE x its span


def encode(*fields: Any) -> bytes:
    """One event as a line."""
    return orjson.dumps(fields) + b"\n"


def decode(line: bytes) -> list[Any]:
    """One line as an event; ValueError naming it when it is not one."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not an event line: {line[:80]!r} ({exc})") from None
    if not isinstance(event, list) or not event or not isinstance(event[0], int):
        raise ValueError(f"not an event line: {line[:80]!r}")
    return event


async def lines(reader: asyncio.StreamReader) -> AsyncIterator[bytes]:
    """Each whole line of ``reader`` until it ends; a line over the reader's limit is skipped
    (logged), and the next one read."""
    skipping = False
    while True:
        try:
            line = await reader.readuntil(b"\n")
        except asyncio.IncompleteReadError:  # the end (a partial last line is not an event)
            return
        except asyncio.LimitOverrunError as exc:  # drop what is buffered, then the line's rest
            await reader.readexactly(exc.consumed)
            if not skipping:
                log.error("an event line over %d bytes was skipped", LIMIT)
            skipping = True
            continue
        if skipping:  # the rest of a line over the limit
            skipping = False
            continue
        yield line


class Line:
    """One end of an event line: the events of one pass of the event loop leave in one write."""

    def __init__(self) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.out: list[bytes] = []

    def send(self, *fields: Any) -> None:
        """One event, written at the end of this pass of the event loop."""
        self.send_line(encode(*fields))

    def send_line(self, line: bytes) -> None:
        """One encoded event, written at the end of this pass of the event loop."""
        self.out.append(line)
        if len(self.out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out, self.out = self.out, []
        if out and self.writer is not None and not self.writer.is_closing():
            self.writer.write(b"".join(out))


class DeciderProxy(Line):
    """The decider as a relay worker reaches it: :class:`~..decider.Decider`'s methods, each an
    event to the decider process; admissions come back as ``ASSIGN``/``REJECT``."""

    def __init__(self, path: str, on_lost: Callable[[], None]) -> None:
        super().__init__()
        self.path = path
        self.on_lost = on_lost
        self.waiting: dict[int, asyncio.Future[int]] = {}
        self.next_id = 0
        self.lost = False
        self._reader: asyncio.Task | None = None

    async def open(self) -> None:
        """Connect to the decider's socket and start reading its answers."""
        reader, self.writer = await asyncio.open_unix_connection(self.path, limit=LIMIT)
        self._reader = asyncio.get_running_loop().create_task(self._read(reader))

    async def close(self) -> None:
        """Stop reading and close the line."""
        if self._reader is not None:
            self._reader.cancel()
        if self.writer is not None:
            self.writer.close()

    def send_line(self, line: bytes) -> None:
        """One encoded event (dropped once the decider is gone)."""
        if not self.lost:
            super().send_line(line)

    def _waiter(self, rid: int) -> asyncio.Future[int]:
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        if self.lost:
            fut.set_exception(Rejected(503, GONE))
        self.waiting[rid] = fut
        return fut

    def admit(self, tokens: int, key_hash: int, key: str, request_id: str,
              stream: bool) -> tuple[int, asyncio.Future[int]]:  # fmt: skip
        """:meth:`Decider.admit` over the line."""
        self.next_id += 1
        fut = self._waiter(self.next_id)
        line = encode(ADMIT, self.next_id, tokens, key_hash, key, request_id, stream)
        if len(line) > LIMIT:  # cannot happen with the front's bounds: never sent if it does
            self.waiting.pop(self.next_id, None)
            if not fut.done():
                fut.set_exception(Rejected(413, "the request's prompt key or id is too long"))
            return self.next_id, fut
        self.send_line(line)
        return self.next_id, fut

    def first_token(self, rid: int, t: float) -> None:
        """``FIRST``: the request's first token reached the worker at ``t``."""
        self.send(FIRST, rid, t)

    def finished(self, rid: int, rank: int, first_t: float, last_t: float, tokens: int,
                 prompt: int, finish_reason: str | None) -> None:  # fmt: skip
        """``FINISH``: the rank answered in full."""
        self.waiting.pop(rid, None)
        self.send(FINISH, rid, rank, first_t, last_t, tokens, prompt, finish_reason)

    def failed(self, rid: int, rank: int, why: str) -> None:
        """``SUSPECT``: the rank failed the request before its first token."""
        self.send(SUSPECT, rid, rank, why)

    def refused(self, rid: int, rank: int, status: int) -> None:
        """``REFUSED``: the rank refused the gateway's key."""
        self.send(REFUSED, rid, rank, status)

    def requeued(self, rid: int, rank: int, last: bool) -> asyncio.Future[int] | None:
        """``REQUEUE``: route it again; the future of the next ``ASSIGN`` (None after the
        last attempt)."""
        fut = None if last else self._waiter(rid)
        self.send(REQUEUE, rid, rank, last)
        return fut

    def abandoned(self, rid: int, outcome: str | None) -> None:
        """``ABANDON``: the request ended otherwise."""
        self.waiting.pop(rid, None)
        self.send(ABANDON, rid, outcome)

    def count(self, outcome: str) -> None:
        """``COUNT``: an outcome to count."""
        self.send(COUNT, 0, outcome)

    def deliver(self, event: list[Any]) -> None:
        """One event from the decider: an admission resolved (``ASSIGN``) or refused."""
        fut = self.waiting.pop(event[1], None)
        if fut is None or fut.done():
            return
        if event[0] == ASSIGN:
            fut.set_result(int(event[2]))
        elif event[0] == REJECT:
            fut.set_exception(Rejected(int(event[2]), str(event[3])))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            async for line in lines(reader):
                try:
                    self.deliver(decode(line))
                except (ValueError, TypeError, IndexError) as exc:  # one bad answer: skipped
                    log.error("a bad answer from the decider was skipped: %s", exc)
        except OSError as exc:
            log.error("the line to the decider broke: %s", exc)
        self.lost = True
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(Rejected(503, GONE))
        self.waiting.clear()
        self.on_lost()


class Link(Line):
    """One relay worker's event line: its request numbers to the decider's."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        super().__init__()
        self.writer = writer
        self.ids: dict[int, int] = {}


class Links:
    """The decider's side of the workers' event lines: each line one call on the decider."""

    def __init__(self, decider: Decider) -> None:
        self.decider = decider
        self.server: asyncio.base_events.Server | None = None
        self.allowed: set[int] = set()  # the workers' pids: the only peers taken

    async def start(self, path: str) -> None:
        """Listen for the workers' lines on the Unix socket ``path``."""
        self.server = await asyncio.start_unix_server(self._serve, path, limit=LIMIT)

    def close(self) -> None:
        """Stop listening for workers' lines."""
        if self.server is not None:
            self.server.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        pid = peer_pid(writer)
        if pid not in self.allowed:
            log.error("refused an event line from pid %s: not a relay worker of this gateway", pid)
            writer.close()
            return
        link = Link(writer)
        try:
            async for line in lines(reader):
                try:
                    self.apply(link, decode(line))
                except Exception:  # one bad event must not stop the others
                    log.exception("relay event %r failed", line[:120])
        except OSError as exc:
            log.warning("a relay worker's event line broke: %s", exc)
        finally:
            self.lost(link)
            writer.close()

    def lost(self, link: Link) -> None:
        """The worker is gone: every request it held leaves the group now."""
        if link.ids:
            log.warning("a relay worker left with %d requests: their slots are freed",
                        len(link.ids))  # fmt: skip
        for rid in link.ids.values():
            self.decider.abandoned(rid, RELAY_LOST)
        link.ids.clear()

    def apply(self, link: Link, ev: list[Any]) -> None:
        """One event from ``link`` (module docstring) as a call on the decider."""
        op, wid, d = ev[0], ev[1], self.decider
        if op == ADMIT:
            rid, fut = d.admit(int(ev[2]), int(ev[3]), str(ev[4]), str(ev[5]), bool(ev[6]))
            link.ids[wid] = rid
            self._answer(link, wid, fut)
            return
        if op == COUNT:
            d.count(str(ev[2]))
            return
        rid = link.ids.pop(wid, None) if op in (FINISH, ABANDON) else link.ids.get(wid)
        if rid is None:
            return
        if op == FIRST:
            d.first_token(rid, float(ev[2]))
        elif op == FINISH:
            rank, first_t, last_t, tokens = int(ev[2]), float(ev[3]), float(ev[4]), int(ev[5])
            why = self.implausible(rid, rank, first_t, last_t, tokens)
            if why:
                log.error("an implausible FINISH from a relay worker was not logged: %s", why)
                d.abandoned(rid, "implausible")
            else:
                d.finished(rid, rank, first_t, last_t, tokens, int(ev[6]), ev[7])
        elif op == SUSPECT:
            d.failed(rid, int(ev[2]), str(ev[3]))
        elif op == REFUSED:
            d.refused(rid, int(ev[2]), int(ev[3]))
        elif op == REQUEUE:
            fut = d.requeued(rid, int(ev[2]), bool(ev[3]))
            if fut is not None:
                self._answer(link, wid, fut)
        elif op == ABANDON:
            d.abandoned(rid, ev[2])

    def implausible(self, rid: int, rank: int, first_t: float, last_t: float,
                    tokens: int) -> str:  # fmt: skip
        """Why a FINISH cannot be the request's ("" when it can)."""
        req = self.decider.held.get(rid)
        if req is None:
            return ""
        placed = int(self.decider.group.rank[req.position])
        if rank != placed:
            return f"rank {rank}, but the request runs on rank {placed}"
        now = time.monotonic() + 1.0
        if not (math.isfinite(first_t) and req.arrival <= first_t <= last_t <= now):
            return f"times {first_t:.3f}..{last_t:.3f} outside the request's life"
        if not 0 < tokens <= BURST + MAX_RATE * (last_t - first_t):
            return f"{tokens} tokens in {last_t - first_t:.3f} s"
        return ""

    def _answer(self, link: Link, wid: int, fut: asyncio.Future[int]) -> None:
        """``ASSIGN`` or ``REJECT`` to the worker once ``fut`` resolves (now if it has)."""

        def send(done: asyncio.Future[int]) -> None:
            if done.cancelled():
                return
            exc = done.exception()
            if isinstance(exc, Rejected):
                link.ids.pop(wid, None)
                link.send(REJECT, wid, exc.status, exc.message)
            elif exc is None:
                link.send(ASSIGN, wid, done.result())

        if fut.done():
            send(fut)
        else:
            fut.add_done_callback(send)


def peer_pid(writer: asyncio.StreamWriter) -> int | None:
    """The pid of a Unix socket's peer (``SO_PEERCRED``; None where it cannot be read)."""
    sock = writer.get_extra_info("socket")
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", creds)[0]

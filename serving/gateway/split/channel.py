"""A relay worker's side of the event line to the decider (:mod:`.wire`): events out, admissions
in. If the decider goes away the worker cannot route: every waiting request is answered 503 and
the worker exits (its streams in flight still finish)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from balanceroute.serving.gateway.split import wire

log = logging.getLogger("balanceroute.gateway")


class Rejected(Exception):
    """The decider refused the request: ``status`` and ``message`` are the client's answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class DeciderChannel:
    """The worker's connection to the decider: one writer, one reader task."""

    def __init__(self, path: str, on_lost: Callable[[], None]) -> None:
        self.path = path
        self.on_lost = on_lost
        self.waiting: dict[int, asyncio.Future[int]] = {}
        self.next_id = 0
        self.lost = False
        self._writer: asyncio.StreamWriter | None = None
        self._out: list[bytes] = []
        self._reader_task: asyncio.Task | None = None

    async def open(self) -> None:
        reader, self._writer = await asyncio.open_unix_connection(self.path, limit=wire.LIMIT)
        self._reader_task = asyncio.get_running_loop().create_task(self._read(reader))

    def new_id(self) -> int:
        self.next_id += 1
        return self.next_id

    def send(self, *fields: object) -> None:
        """One event to the decider (dropped when the decider is gone); the events of one pass
        of the event loop leave in one write."""
        if self._writer is None or self.lost:
            return
        self._out.append(wire.encode(*fields))
        if len(self._out) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        out, self._out = self._out, []
        if self._writer is not None and not self.lost and out:
            self._writer.write(b"".join(out))

    def admission(self, rid: int) -> asyncio.Future[int]:
        """The future the decider's next ``ASSIGN`` for ``rid`` resolves."""
        fut = asyncio.get_running_loop().create_future()
        if self.lost:
            fut.set_exception(Rejected(503, "the gateway's decider is gone"))
        self.waiting[rid] = fut
        return fut

    def forget(self, rid: int) -> None:
        self.waiting.pop(rid, None)

    def deliver(self, event: list[Any]) -> None:
        """One event from the decider: an admission resolved (``ASSIGN``) or refused."""
        fut = self.waiting.pop(event[1], None)
        if fut is None or fut.done():
            return
        if event[0] == wire.ASSIGN:
            fut.set_result(int(event[2]))
        elif event[0] == wire.REJECT:
            fut.set_exception(Rejected(int(event[2]), str(event[3])))

    async def _read(self, reader: asyncio.StreamReader) -> None:
        try:
            while line := await reader.readline():
                self.deliver(wire.decode(line))
        except (OSError, ValueError) as exc:
            log.error("the line to the decider broke: %s", exc)
        self.lost = True
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(Rejected(503, "the gateway's decider is gone"))
        self.waiting.clear()
        self.on_lost()

    async def close(self) -> None:
        if self._reader_task is not None:
            self._reader_task.cancel()
        if self._writer is not None:
            self._writer.close()

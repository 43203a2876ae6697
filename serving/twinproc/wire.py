"""The twins' wire: length-prefixed pickled frames over one end of a socket pair, never waiting.

The parent (:class:`~.process.TwinProcess`) and its child (:mod:`.child`) talk over a
socket pair: every frame is a 4-byte length and a pickle. ``send`` and ``receive`` use
``MSG_DONTWAIT``: what the socket does not take stays in :attr:`Wire.out` (the parent bounds it),
and only complete frames are returned.
"""

from __future__ import annotations

import pickle
import select
import socket
import struct
from typing import Any

HEADER = struct.Struct("<I")


class Wire:
    """Length-prefixed pickled frames over one end of a socket pair; ``send`` and
    ``receive`` never wait (``MSG_DONTWAIT``): what the socket does not take stays buffered."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.out = bytearray()
        self.inb = bytearray()
        self.closed = False

    def send(self, obj: Any) -> None:
        self.send_bytes(pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL))

    def send_bytes(self, data: bytes) -> None:
        self.out += HEADER.pack(len(data))
        self.out += data
        self.flush()

    def flush(self) -> None:
        """Write what the socket takes now."""
        while self.out and not self.closed:
            try:
                n = self.sock.send(self.out, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                self.closed = True
                return
            del self.out[:n]

    def receive(self, wait_s: float | None = 0.0) -> list[Any]:
        """The complete frames that arrived (waiting up to ``wait_s`` for the first bytes;
        None: until some come or the peer closes)."""
        if wait_s != 0.0 and not self.closed:
            try:
                select.select([self.sock], [], [], wait_s)
            except (OSError, ValueError):
                self.closed = True
        while not self.closed:
            try:
                chunk = self.sock.recv(1 << 16, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                break
            except OSError:
                self.closed = True
                break
            if not self._got(chunk):
                break
        return self._frames()

    def _got(self, chunk: bytes) -> bool:
        if not chunk:
            self.closed = True
            return False
        self.inb += chunk
        return True

    def _frames(self) -> list[Any]:
        out, buf, at = [], self.inb, 0
        while len(buf) - at >= HEADER.size:
            (n,) = HEADER.unpack_from(buf, at)
            if len(buf) - at - HEADER.size < n:
                break
            out.append(pickle.loads(bytes(buf[at + HEADER.size : at + HEADER.size + n])))
            at += HEADER.size + n
        del buf[:at]
        return out

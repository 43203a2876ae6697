"""Fake ranks for fault checks: a TCP listener that answers /health but never a completion."""

from __future__ import annotations

import socket
import threading
from types import TracebackType

HEALTHY = b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class HangingRank:
    """Accepts connections; answers GET /health with 200, and anything else never."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.held: list[socket.socket] = []
        self.posts = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        """Accept until closed; each connection is read by a thread of its own."""
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        """Answer a health probe; hold any other request open without a byte."""
        try:
            head = conn.recv(65536)
            if head.startswith(b"GET /health"):
                conn.sendall(HEALTHY)
                conn.close()
            else:
                self.posts += 1
        except OSError:
            pass

    def close(self) -> None:
        """Stop listening and drop every held connection."""
        self._stop.set()
        self.sock.close()
        for conn in self.held:
            conn.close()

    def __enter__(self) -> HangingRank:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:  # fmt: skip
        self.close()

"""Fake ranks: one that answers /health but never a completion, one that aborts every stream."""

from __future__ import annotations

import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
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


class AbortingRank:
    """An OpenAI-compatible rank that ends every stream as vLLM does when it is stopped
    gracefully: a few tokens, a chunk with ``finish_reason: "abort"``, then ``[DONE]``."""

    TOKENS = 3

    def __init__(self) -> None:
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _AbortHandler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving."""
        self.server.shutdown()
        self.server.server_close()

    def __enter__(self) -> AbortingRank:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: TracebackType | None
                 ) -> None:  # fmt: skip
        self.close()


def _chunk(index: int, text: str, finish: str | None) -> bytes:
    """One SSE event of vLLM's completion stream."""
    event = {"id": "cmpl-abort", "object": "text_completion", "created": 0, "model": "tiny",
             "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish,
                          "stop_reason": None}]}  # fmt: skip
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class _AbortHandler(BaseHTTPRequestHandler):
    """Serves /health, /v1/models and aborted completion streams."""

    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:
        """Quiet."""

    def _send(self, status: int, body: bytes, kind: str = "application/json") -> None:
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        """Health and the model list."""
        if self.path.startswith("/v1/models"):
            self._send(200, json.dumps({"object": "list", "data": [{"id": "tiny"}]}).encode())
        else:
            self._send(200, b"")

    def do_POST(self) -> None:
        """A stream of AbortingRank.TOKENS tokens ended by an abort."""
        self.rfile.read(int(self.headers.get("content-length", "0")))
        events = [_chunk(i, f" t{i}", None) for i in range(AbortingRank.TOKENS)]
        events.append(_chunk(AbortingRank.TOKENS, "", "abort"))
        body = b"".join(events) + b"data: [DONE]\n\n"
        self._send(200, body, "text/event-stream")

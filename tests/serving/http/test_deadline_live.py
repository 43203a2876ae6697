"""The request deadlines of the uvicorn skeleton (serving/http/deadline.py), on a real process:
a slow client is cut at the header or body deadline, an idle connection is closed, and nothing
is cut once a request has arrived (a streamed answer longer than every deadline, keep-alive)."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port
from tests.serving.http.deadline_app import CHUNKS

REPO = Path(__file__).resolve().parents[3]
HEADER_S, BODY_S, IDLE_S = 1.0, 1.5, 1.0
TRICKLE_S = 0.1  # between two bytes of a slow client: the whole request would take ~20 s


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    env = clean_env({"BALANCEROUTE_HEADER_TIMEOUT_S": str(HEADER_S),
                     "BALANCEROUTE_BODY_TIMEOUT_S": str(BODY_S),
                     "BALANCEROUTE_IDLE_TIMEOUT_S": str(IDLE_S)}, drop_prefix="BALANCEROUTE_")  # fmt: skip
    proc = ServerProcess([sys.executable, "-m", "tests.serving.http.deadline_app", str(port)],
                         log=tmp_path_factory.mktemp("deadline") / "server.log", env=env,
                         cwd=REPO)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        proc.wait_ready([url + "/ok"], timeout_s=60)
        yield url
    finally:
        proc.kill()


def _port(url: str) -> int:
    return int(url.rsplit(":", 1)[1])


def _trickle(url: str, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` a byte at a time; how many bytes went before the server closed, and
    what it answered (the whole request is sent if it never closes)."""
    with socket.create_connection(("127.0.0.1", _port(url)), timeout=5) as conn:
        for sent, byte in enumerate(request):
            try:
                conn.sendall(bytes([byte]))
            except OSError:
                return sent, b""
            conn.settimeout(TRICKLE_S)
            try:
                answer = conn.recv(4096)
            except TimeoutError:
                continue
            except OSError:
                return sent, b""
            conn.settimeout(5)
            while chunk := _recv(conn):
                answer += chunk
            return sent + 1, answer
        return len(request), b""


def _recv(conn: socket.socket) -> bytes:
    try:
        return conn.recv(4096)
    except OSError:
        return b""


def test_slow_headers_get_408_and_are_closed(server: str) -> None:
    """Headers sent a byte at a time: 408 and closed before they are complete."""
    request = b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 200 + b"\r\n\r\n"
    sent, answer = _trickle(server, request)
    assert sent < len(request), "the whole slow request was accepted"
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_slow_body_is_closed(server: str) -> None:
    """Headers at once, then a body a byte at a time: closed before the body is complete."""
    payload = b"x" * 200
    head = b"POST /echo HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 200\r\n\r\n"
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=5) as conn:
        conn.sendall(head)
        sent, answer = 0, b""
        conn.settimeout(TRICKLE_S)
        for byte in payload:
            try:
                conn.sendall(bytes([byte]))
                answer = conn.recv(4096)
                break  # an answer or a close (b"")
            except TimeoutError:
                sent += 1
            except OSError:
                break
    assert sent < len(payload), "the whole slow body was accepted"
    assert not answer.startswith(b"HTTP/1.1 200"), answer[:200]


def test_idle_connection_is_closed(server: str) -> None:
    """A connection that sends nothing is closed (408) at the header deadline."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=HEADER_S * 10) as conn:
        answer = conn.recv(4096)
        while chunk := _recv(conn):
            answer += chunk
    assert answer.startswith(b"HTTP/1.1 408"), answer[:200]


def test_kept_alive_connection_is_closed_when_idle(server: str) -> None:
    """After an answer, a kept-alive connection that sends nothing more is closed."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=IDLE_S * 10) as conn:
        conn.sendall(b"GET /ok HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        answer = b""
        while not answer.endswith(b"\r\n\r\nok"):  # the whole answer, however it is split
            chunk = conn.recv(4096)
            assert chunk, f"closed before the answer ended: {answer!r}"
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
        assert _recv(conn) == b"", "the idle connection stayed open"


def test_requests_that_arrived_are_never_cut(server: str) -> None:
    """A streamed answer longer than every deadline arrives whole; a kept-alive connection
    serves a second request after a pause shorter than the idle deadline."""
    with httpx.Client(base_url=server, timeout=30, trust_env=False) as client:
        t0 = time.monotonic()
        slow = client.get("/slow")
        took = time.monotonic() - t0
        assert took > max(HEADER_S, BODY_S, IDLE_S), "the answer was not longer than the deadlines"
        assert slow.text.count("chunk") == CHUNKS, slow.text
        time.sleep(IDLE_S / 4)
        assert client.post("/echo", content=b"y" * 1000).text == "1000"


def test_a_slow_request_behind_an_answer_never_cuts_it(server: str) -> None:
    """The first bytes of a next request, never finished, sent while a long answer streams on
    the same connection: the answer arrives whole, then the connection is closed."""
    with socket.create_connection(("127.0.0.1", _port(server)), timeout=30) as conn:
        conn.sendall(b"GET /slow HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\nGET /ok HT")
        data = b""
        while chunk := _recv(conn):
            data += chunk
    assert data.startswith(b"HTTP/1.1 200"), data[:200]
    assert data.count(b"chunk ") == CHUNKS, data

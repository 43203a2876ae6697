"""Helpers of the gateway's live tests: a real ``balanceroute gateway`` process on a free port."""

from __future__ import annotations

import select
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil

from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port

CLI = [sys.executable, "-c", "import sys; from balanceroute.cli import main; sys.exit(main())"]


class GatewayProcess:
    """``balanceroute gateway`` in a subprocess, stopped by its own pid."""

    def __init__(self, log: Path, ranks: list[str], *args: str, env: dict | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*CLI, "gateway", "--port", str(self.port), "--tick", "5ms"]
        for r in ranks:
            argv += ["--rank", r]
        argv += list(args)
        self.out_path = log
        # in the test's folder: a SQLite MLflow store keeps its artifacts under ./mlruns
        self.process = ServerProcess(argv, log=log, env=clean_env(env), cwd=log.parent)
        self.proc = self.process.proc
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        self.process.wait_ready([self.url + "/readyz"], timeout_s)

    def log(self) -> str:
        return self.process.log()

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        return metric_total(parse_metrics(text), name, **labels)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10.0, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kw.pop("timeout", 60.0), **kw)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the gateway writes its logs and results), then kill if it hangs."""
        return self.process.terminate(timeout_s)

    def kill(self) -> None:
        self.process.kill()


def completion(url: str, max_tokens: int, *, stream: bool, prompt: str = "hello there",
               rid: str | None = None, timeout: float = 60.0) -> httpx.Response:  # fmt: skip
    """One completion request (``ignore_eos``: exactly ``max_tokens`` tokens)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True, "stream": stream}
    headers = {"x-request-id": rid} if rid else {}
    return httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=timeout)


def token_events(text: str) -> int:
    """Token chunks in an SSE body."""
    import orjson

    n = 0
    for line in text.splitlines():
        if line.startswith("data: {"):
            obj = orjson.loads(line[6:])
            choices = obj.get("choices") or []
            if choices and choices[0].get("text") is not None:
                n += 1
    return n


def big_head(port: int, size: int, timeout_s: float = 10.0) -> tuple[bytes, float]:
    """A request whose one header is ``size`` bytes, sent in 64 KiB writes until the server
    answers or closes: its answer and the seconds until it came."""
    t0 = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nhost: 127.0.0.1\r\nx-big: ")
        sent, chunk = 0, b"a" * 65536
        try:
            while sent < size and not select.select([s], [], [], 0)[0]:
                s.sendall(chunk)
                sent += len(chunk)
            if sent >= size:
                s.sendall(b"\r\n\r\n")
        except OSError:
            pass  # the server stopped reading: its answer may be there
        answer = b""
        try:
            while data := s.recv(65536):
                answer += data
        except OSError:
            pass
    return answer, time.monotonic() - t0


def push_heads(
    port: int, pids: list[int], n: int = 8, size: int = 16 << 20
) -> tuple[list[bytes], float]:
    """``n`` connections at once, each pushing a ``size``-byte header (:func:`big_head`): their
    answers, and how many bytes the processes ``pids`` grew by meanwhile (RSS)."""
    procs = [psutil.Process(p) for p in pids]
    before = sum(p.memory_info().rss for p in procs)
    answers: list[bytes] = []
    pushers = [threading.Thread(target=lambda: answers.append(big_head(port, size)[0]))
               for _ in range(n)]  # fmt: skip
    for t in pushers:
        t.start()
    for t in pushers:
        t.join(60)
    return answers, sum(p.memory_info().rss for p in procs) - before

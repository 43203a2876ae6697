"""Helpers of the gateway's live tests: a real ``balanceroute gateway`` process on a free port."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from emulator_helpers import REPO, free_port_range, kill, terminate

from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics

CLI = [sys.executable, "-c", "import sys; from balanceroute.cli import main; sys.exit(main())"]


class GatewayProcess:
    """``balanceroute gateway`` in a subprocess, stopped by its own pid."""

    def __init__(self, log: Path, ranks: list[str], *args: str, env: dict | None = None) -> None:
        self.port = free_port_range(1)
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [*CLI, "gateway", "--port", str(self.port), "--tick", "5ms"]
        for r in ranks:
            argv += ["--rank", r]
        argv += list(args)
        full_env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
        self.out_path = log
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(
            argv, cwd=REPO, env=full_env, stdout=self._out, stderr=self._out
        )
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(self.url + "/readyz", timeout=1.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        self.kill()
        raise RuntimeError(f"gateway not ready: {self.log()}")

    def log(self) -> str:
        self._out.flush()
        return self.out_path.read_text(errors="replace")[-3000:]

    def metric(self, name: str, **labels: str) -> float:
        text = httpx.get(self.url + "/metrics", timeout=5.0).text
        return metric_total(parse_metrics(text), name, **labels)

    def get(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.get(self.url + path, timeout=10.0, **kw)

    def post(self, path: str, **kw: Any) -> httpx.Response:
        return httpx.post(self.url + path, timeout=kw.pop("timeout", 60.0), **kw)

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM (the gateway writes its logs and results), then kill if it hangs."""
        code = terminate(self.proc, timeout_s)
        self._out.close()
        return code

    def kill(self) -> None:
        kill(self.proc)


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

"""The gateway and bench as command lines: started, waited for and stopped by their own pid."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

BIN = Path(sys.executable).with_name("balanceroute")


def free_port() -> int:
    """A TCP port nobody listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_process(proc: subprocess.Popen, timeout_s: float = 20.0) -> int:
    """SIGTERM, then SIGKILL after ``timeout_s``; the exit code."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return int(proc.returncode)


class Gateway:
    """``balanceroute gateway`` on a free port in front of ``ranks``; its output in ``log``."""

    def __init__(self, tmp: Path, ranks: list[str], *args: str, env: dict[str, str] | None = None,
                 ready: str = "/healthz") -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = tmp / f"gateway-{self.port}.log"
        argv = [str(BIN), "gateway", "--port", str(self.port), "--slots", "8", "--no-mlflow"]
        argv += ["--health-interval", "500ms"]
        for rank in ranks:
            argv += ["--rank", rank]
        clean = {k: v for k, v in os.environ.items() if not k.startswith("BALANCEROUTE_")}
        full_env = {**clean, "MLFLOW_DISABLE_TELEMETRY": "true", **(env or {})}
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen([*argv, *args], env=full_env, stdout=self._log,
                                     stderr=subprocess.STDOUT)  # fmt: skip
        self._wait(ready)

    def _wait(self, path: str, timeout_s: float = 90.0) -> None:
        """Wait until ``path`` answers 200 (the gateway has started), or fail with its log."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"gateway exited {self.proc.returncode}: {self.output()}")
            try:
                if httpx.get(self.url + path, timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"gateway not ready in {timeout_s} s: {self.output()}")

    def output(self) -> str:
        """Everything the gateway printed so far."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")

    def stop(self, timeout_s: float = 20.0) -> int:
        """Stop the gateway (SIGTERM, SIGKILL if it hangs); its exit code."""
        code = stop_process(self.proc, timeout_s)
        self._log.close()
        return code


def run_bench(tmp: Path, url: str, model: str, *args: str, timeout_s: float = 240.0
              ) -> subprocess.CompletedProcess:  # fmt: skip
    """Run ``balanceroute bench`` against ``url`` to its end (bounded by ``timeout_s``)."""
    argv = [str(BIN), "bench", "--url", url, "--model", model, "--out", str(tmp / "bench"), *args]
    tmp.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "OPENAI_API_KEY"}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=timeout_s)


def write_trace(path: Path, requests: int, output_tokens: int) -> Path:
    """An Azure-format trace: ``requests`` requests 0.3 s apart, 16 prompt tokens each."""
    rows = [f"2023-11-16 18:15:{10 + i * 0.3:010.7f},16,{output_tokens}" for i in range(requests)]
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "\n".join(rows) + "\n")
    return path

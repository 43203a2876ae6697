"""Helpers of the live test-bed tests: a real emulator process on free loopback ports."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics

REPO = Path(__file__).resolve().parents[2]


def free_port_range(count: int, attempts: int = 50) -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now."""
    for _ in range(attempts):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = int(s.getsockname()[1])
        if base + count > 65535:
            continue
        held = []
        try:
            for p in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


class Emulator:
    """``python -m balanceroute.serving.testbed.emulator`` in a subprocess, stopped by its own pid."""

    def __init__(self, log: Path, **fields: Any) -> None:
        ranks = int(fields.get("ranks", 8))
        self.config = EmulatorConfig.from_dict({"port_base": free_port_range(ranks), **fields})
        self.urls = self.config.urls()
        self.out_path = log
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
        args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator"]
        args.append(json.dumps(self.config.as_dict()))
        self._out = open(log, "wb")
        self.proc = subprocess.Popen(args, cwd=REPO, env=env, stdout=self._out, stderr=self._out)
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll every rank's /health until it answers 200."""
        deadline = time.monotonic() + timeout_s
        pending = list(self.urls)
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"emulator exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(pending[0] + "/health", timeout=1.0).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(0.05)
        if pending:
            self.kill()
            raise RuntimeError(f"emulator not ready: {self.log()}")

    def log(self) -> str:
        self._out.flush()
        return self.out_path.read_text(errors="replace")[-3000:]

    def metrics(self, name: str, **labels: str) -> float:
        """A vLLM metric summed over every rank."""
        total = 0.0
        for url in self.urls:
            text = httpx.get(url + "/metrics", timeout=5.0).text
            total += metric_total(parse_metrics(text), name, **labels)
        return total

    def state(self) -> dict[str, Any]:
        return httpx.get(self.urls[0] + "/v1/emulator/state", timeout=5.0).json()

    def stop(self, timeout_s: float = 20.0) -> None:
        """SIGTERM (the emulator writes its logs), then kill if it does not exit."""
        terminate(self.proc, timeout_s)
        self._out.close()

    def kill(self) -> None:
        kill(self.proc)


def terminate(proc: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM so the server writes its logs, then SIGKILL if it has not exited in time."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            kill(proc)
    return int(proc.returncode or 0)


def kill(proc: subprocess.Popen) -> None:
    """SIGKILL, and reap the process."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=10)

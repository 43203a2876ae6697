"""Helpers of the live test-bed tests: a real emulator process on free loopback ports."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx

from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_ports

REPO = Path(__file__).resolve().parents[3]


class Emulator:
    """``python -m balanceroute.serving.testbed.emulator`` in a subprocess, stopped by its own pid."""

    def __init__(self, log: Path, **fields: Any) -> None:
        ranks = int(fields.get("ranks", 8))
        self.config = EmulatorConfig.from_dict({"port_base": free_ports(ranks), **fields})
        self.urls = self.config.urls()
        self.out_path = log
        args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator"]
        args.append(json.dumps(self.config.as_dict()))
        self.process = ServerProcess(args, log=log, env=clean_env(), cwd=REPO)
        self.proc = self.process.proc
        self.wait_ready()

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Poll every rank's /health until it answers 200."""
        self.process.wait_ready([url + "/health" for url in self.urls], timeout_s, poll_s=0.05)

    def log(self) -> str:
        return self.process.log()

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
        self.process.terminate(timeout_s)

    def kill(self) -> None:
        self.process.kill()

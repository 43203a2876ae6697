"""The fake rank of :mod:`tests.serving.gateway.fake_rank` in a subprocess on a free port."""

from __future__ import annotations

import sys
from pathlib import Path

from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port
from tests.serving.testbed.helpers import REPO


class FakeRank:
    """One fake vLLM rank, stopped by its own pid."""

    def __init__(self, log: Path, *args: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [sys.executable, "-m", "tests.serving.gateway.fake_rank", str(self.port), *args]
        self.process = ServerProcess(argv, log=log, env=clean_env(), cwd=REPO)
        self.process.wait_ready([self.url + "/health"], 60.0, poll_s=0.05)

    def stop(self) -> None:
        self.process.terminate(10.0)

"""The gateway and bench as command lines: started, waited for and stopped by their own pid."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port

BIN = Path(sys.executable).with_name("balanceroute")
# more gateway flags for every check, e.g. "--relay-workers 1"
EXTRA_ENV = "CONFORMANCE_GATEWAY_ARGS"


class Gateway:
    """``balanceroute gateway`` on a free port in front of ``ranks``; its output in a log file."""

    def __init__(self, tmp: Path, ranks: list[str], *args: str, env: dict[str, str] | None = None,
                 ready: str = "/healthz") -> None:  # fmt: skip
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [str(BIN), "gateway", "--port", str(self.port), "--slots", "8", "--no-mlflow"]
        argv += ["--health-interval", "500ms", *shlex.split(os.environ.get(EXTRA_ENV, ""))]
        for rank in ranks:
            argv += ["--rank", rank]
        self.server = ServerProcess(
            [*argv, *args],
            log=tmp / f"gateway-{self.port}.log",
            env=clean_env(env, drop_prefix="BALANCEROUTE_"),
        )
        self.proc = self.server.proc
        self.server.wait_ready([self.url + ready])

    def output(self) -> str:
        """The tail of what the gateway printed so far."""
        return self.server.log()

    def stop(self, timeout_s: float = 20.0) -> int:
        """Stop the gateway (SIGTERM, SIGKILL if it hangs); its exit code."""
        return self.server.terminate(timeout_s)


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

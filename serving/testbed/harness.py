"""Start a server process on loopback, wait until it answers, stop it: the one helper the tests
and ``benchmarks/perf`` share.

:func:`free_port` and :func:`free_ports` find unused loopback ports (``free_ports(n)`` a base
``b`` such that ``b .. b + n - 1`` are all free); :class:`ServerProcess` runs a command with its
output in a log file, polls URLs until each answers 200 (failing with the log's tail if the
process exits or the deadline passes) and stops it by its own pid: ``terminate`` sends SIGTERM
(servers write their logs and results on it) and kills after a grace period, ``kill`` kills.
A server that starts children of its own (``mlflow server`` runs gunicorn or uvicorn workers)
is started with ``group=True`` in a session of its own: the signals then go to its process
group, so no child outlives it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

import httpx

LOOPBACK = "127.0.0.1"


def free_port() -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket() as s:
        s.bind((LOOPBACK, 0))
        return int(s.getsockname()[1])


def free_ports(count: int, attempts: int = 50) -> int:
    """A base port such that ``base .. base + count - 1`` are all free right now."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65535:
            continue
        held: list[socket.socket] = []
        try:
            for port in range(base, base + count):
                sock = socket.socket()
                held.append(sock)
                sock.bind((LOOPBACK, port))
            return base
        except OSError:
            continue
        finally:
            for sock in held:
                sock.close()
    raise RuntimeError(f"no {count} consecutive free ports")


def clean_env(extra: dict[str, str] | None = None, *, drop_prefix: str | None = None) -> dict:
    """This process's environment (without variables starting with ``drop_prefix``), MLflow's
    telemetry off, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not (drop_prefix and k.startswith(drop_prefix))}
    env["MLFLOW_DISABLE_TELEMETRY"] = "true"
    env.update(extra or {})
    return env


class ServerProcess:
    """A command in a subprocess, its output in ``log`` (or discarded), stopped by its own pid."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        log: Path | None = None,
        env: dict[str, str] | None = None,
        cwd: Path | str | None = None,
        group: bool = False,
    ) -> None:
        self.log_path = log
        self.group = group
        self._out = open(log, "wb") if log is not None else subprocess.DEVNULL
        self.proc = subprocess.Popen(
            list(args),
            cwd=cwd,
            env=env,
            stdout=self._out,
            stderr=subprocess.STDOUT,
            start_new_session=group,
        )
        self.pid = self.proc.pid

    def wait_ready(self, urls: Sequence[str], timeout_s: float = 90.0, poll_s: float = 0.1) -> None:
        """Poll each of ``urls`` until it answers 200; on a deadline or an exit, kill the process
        and raise with the tail of its log."""
        deadline = time.monotonic() + timeout_s
        pending = list(urls)
        while pending and time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.close_log()
                raise RuntimeError(f"{self.proc.args[:4]} exited with {self.proc.returncode}: {self.log()}")
            try:
                if httpx.get(pending[0], timeout=1.0, trust_env=False).status_code == 200:
                    pending.pop(0)
                    continue
            except httpx.HTTPError:
                pass
            time.sleep(poll_s)
        if pending:
            self.kill()
            raise RuntimeError(f"not ready at {pending[0]} after {timeout_s:g} s: {self.log()}")

    def running(self) -> bool:
        return self.proc.poll() is None

    def log(self) -> str:
        """The last 3,000 characters of the process's output."""
        if self.log_path is None:
            return ""
        if not isinstance(self._out, int) and not self._out.closed:
            self._out.flush()
        return self.log_path.read_text(errors="replace")[-3000:]

    def terminate(self, timeout_s: float = 30.0) -> int:
        """SIGTERM, so the server writes its logs; SIGKILL if it has not exited in time."""
        if self.proc.poll() is None:
            self._signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.group:  # children that outlived their parent
            self._signal(signal.SIGKILL)
        self.close_log()
        return int(self.proc.returncode or 0)

    def kill(self) -> None:
        """SIGKILL, and reap the process."""
        if self.proc.poll() is None or self.group:
            self._signal(signal.SIGKILL)
            self.proc.wait(timeout=10)
        self.close_log()

    def _signal(self, sig: signal.Signals) -> None:
        """``sig`` to the process, or to its whole process group (``group``: its own session)."""
        if not self.group:
            self.proc.send_signal(sig)
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.pid, sig)

    def close_log(self) -> None:
        if not isinstance(self._out, int) and not self._out.closed:
            self._out.close()

"""Helpers of the service tests: a real ``balanceroute serve`` process on a free loopback port
(started, waited for and stopped by :mod:`balanceroute.serving.testbed.harness`)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson

from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.model_store import load_file
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port

REPO = Path(__file__).resolve().parents[3]
TOKEN = "test-token-0123456789abcdef"


class Server:
    """The service in a subprocess: started, waited for, killed by its own pid.

    ``via_cli`` starts ``balanceroute serve --model-uri ...`` (which checks its flags, then execs
    ``python -m balanceroute.serving.service``); by default that module is started directly with
    the same settings in ``BALANCEROUTE_*``, which skips building the whole CLI first.
    """

    def __init__(
        self,
        model_uri: str,
        model_uri_b: str | None = None,
        *,
        env: dict[str, str] | None = None,
        log: Path | None = None,
        ready: bool = True,
        via_cli: bool = False,
    ) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        full_env = clean_env(env, drop_prefix="BALANCEROUTE_")
        if via_cli:
            args = [sys.executable, "-m", "balanceroute.cli", "serve", "--model-uri", model_uri]
            args += ["--model-uri-b", model_uri_b] if model_uri_b else []
            args += ["--port", str(self.port)]
        else:
            args = [sys.executable, "-m", "balanceroute.serving.service"]
            full_env["BALANCEROUTE_MODEL_URI"] = model_uri
            full_env["BALANCEROUTE_PORT"] = str(self.port)
            if model_uri_b:
                full_env["BALANCEROUTE_MODEL_URI_B"] = model_uri_b
        self.process = ServerProcess(args, log=log, env=full_env, cwd=REPO)
        self.proc = self.process.proc
        self.wait("/readyz" if ready else "/healthz")

    def wait(self, path: str, timeout_s: float = 90.0) -> None:
        """Poll ``path`` until it answers 200 (or fail with the server's log)."""
        self.process.wait_ready([self.url + path], timeout_s)

    def log(self) -> str:
        return self.process.log()

    def stop(self) -> None:
        """Kill the process (by its pid) and reap it."""
        self.process.kill()

    def client(self, token: str | None = None) -> httpx.Client:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30.0, trust_env=False)


def load_model(model_dir: Path, kind: str) -> CompletionEstimator:
    """A fresh in-process copy of a saved model (the server loads the same bytes)."""
    return load_file(model_dir / f"{kind}.joblib")


def post(client: httpx.Client, path: str, body: Any) -> httpx.Response:
    """POST an orjson body (numpy values allowed)."""
    return client.post(
        path,
        content=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
        headers={"content-type": "application/json"},
    )


def running_rows(
    prompt: Sequence[int], age: Sequence[int], keys: Sequence[int | str | None]
) -> list[dict[str, Any]]:
    """Request rows for ``POST /v1/predict``."""
    return [
        {"id": i, "prompt_tokens": int(p), "age": int(a), "prompt_key": k}
        for i, (p, a, k) in enumerate(zip(prompt, age, keys, strict=True))
    ]


def random_running(rng: np.random.Generator, n: int, key_pool: Sequence[int]) -> dict:
    """Random running requests: arrays and their rows (keys drawn from ``key_pool``)."""
    prompt = rng.integers(1, 8000, n)
    age = rng.integers(0, 3000, n)
    keys = np.asarray(key_pool, dtype=np.uint64)[rng.integers(0, len(key_pool), n)]
    rows = running_rows(prompt.tolist(), age.tolist(), keys.tolist())
    return {"prompt": prompt, "age": age, "keys": keys, "rows": rows}


def completion_rows(history: Any, key_pool: np.ndarray, n: int) -> dict[str, Any]:
    """The last ``n`` requests of ``history`` as completions (keys from ``key_pool``, times from
    5,000 to 5,100 s): ``tail``, ``keys``, ``times`` and the ``rows`` of ``POST /v1/observe``."""
    tail = history.tail(n)
    keys = np.asarray(key_pool)[np.arange(n) % key_pool.size]
    times = np.linspace(5000.0, 5100.0, n)
    rows = [
        {"prompt_tokens": int(p), "output_tokens": int(o), "prompt_key": int(k), "time_s": t}
        for p, o, k, t in zip(
            tail["prompt_tokens"], tail["output_tokens"], keys, times.tolist(), strict=True
        )
    ]
    return {"tail": tail, "keys": keys, "times": times, "rows": rows}

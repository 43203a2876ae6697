"""The router's client of ``balanceroute serve``: a completion estimator that predicts over HTTP.

:class:`RemoteEstimator` is a :class:`CompletionEstimator`, so BR-H uses it like any other. Each
``predict`` is one batched ``POST /v1/predict`` (orjson body, keep-alive connection) under a
time budget well below an engine step. The transport is the standard library's
``http.client``: it writes headers and body in one ``send``, a shorter round trip than
``httpx`` gives (docs/design.md, "The router's client"), and a socket timeout bounds every
phase of the call by what is left of the budget. It never raises into the router: on a timeout, a
connection error, a non-2xx status or a malformed answer, the local ``fallback`` estimator
answers instead (with none given, the ``none`` estimator, i.e. prediction-free BR-H), and the
failure is counted by kind. After a failure the service is left alone for a short, growing
back-off (a circuit breaker), so a dead service costs one refused connection now and then,
not one per routing step.

``observe`` never touches the network: completions feed the local fallback at once and wait in
a bounded buffer (oldest dropped, and counted, beyond ``max_pending`` rows) that the next
``predict`` sends first, on the same connection and within the same budget. So the service sees
every completion before the prediction that follows it, as an in-process estimator would.

Pickling (joblib parallel runs) keeps the configuration and drops the connection, the buffer,
the circuit state and the counters: each copy opens its own connection lazily and reports its
own ``stats()``.
"""

from __future__ import annotations

import http.client
import os
import socket
import time
from collections import Counter, deque
from typing import Any, Self
from urllib.parse import urlsplit

import numpy as np
import orjson
import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.predict.base import (
    CompletedBatch,
    CompletionEstimator,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.health import prediction_problem
from balanceroute.predict.no_prediction import NoPrediction

TOKEN_ENV = "BALANCEROUTE_API_TOKEN"
BACKOFF_S = (0.05, 1.0)  # first and longest pause after a failure
LATENCY_SAMPLES = 100_000


_STALE = (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError)


class RemoteFailure(Exception):
    """A remote call that did not produce a usable answer; ``kind`` names the failure."""

    def __init__(self, kind: str, detail: str = "") -> None:
        super().__init__(f"{kind}: {detail}" if detail else kind)
        self.kind = kind


class RemoteEstimator(CompletionEstimator):
    """Predictions from a running service, with a local fallback that never lets routing stall.

    ``token`` defaults to ``$BALANCEROUTE_API_TOKEN``; ``model`` selects an arm, alias or version
    of the service's loaded models (default: its arm ``a``); ``horizon`` defaults to the
    fallback's (else ``DEFAULT_HORIZON``) and is asked of the service, which answers for it or refuses.
    """

    provides_survival = True

    def __init__(
        self,
        url: str,
        *,
        fallback: CompletionEstimator | None,
        timeout_s: float = 0.02,
        token: str | None = None,
        model: str | None = None,
        horizon: int | None = None,
        max_pending: int = 65_536,
    ) -> None:
        if horizon is None:
            horizon = fallback.horizon if fallback is not None else DEFAULT_HORIZON
        super().__init__(horizon=horizon)
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
        self.url = url.rstrip("/")
        self.timeout_s = float(timeout_s)
        self.token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
        self.model = model
        self.max_pending = int(max_pending)
        self.fallback = fallback if fallback is not None else NoPrediction(horizon=horizon).fit()
        self.fitted_ = True
        self._start()

    # ---- identity and lifecycle ------------------------------------------------------------
    @property
    def name(self) -> str:  # type: ignore[override]
        """``remote:<kind>`` once the service has said which kind of model answers."""
        kind = (self.remote_model_ or {}).get("kind")
        return f"remote:{kind}" if kind else "remote"

    def _start(self) -> None:
        self._client: http.client.HTTPConnection | None = None
        self._prefix = ""
        self._pending: deque[CompletedBatch] = deque()
        self._pending_rows = 0
        self._failures = 0
        self._open_until = 0.0
        self._latency_ms: deque[float] = deque(maxlen=LATENCY_SAMPLES)
        self._errors: Counter[str] = Counter()
        self._counts: Counter[str] = Counter()
        self.remote_model_: dict[str, Any] | None = None
        self.last_error_: str | None = None

    def __getstate__(self) -> dict[str, Any]:
        keep = ("horizon", "url", "timeout_s", "token", "model", "max_pending", "fallback")
        return {k: self.__dict__[k] for k in keep} | {"fitted_": True}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._start()

    def close(self) -> None:
        """Close the keep-alive connection (a later call opens a new one)."""
        if self._client is not None:
            self._client.close()
            self._client = None

    def params(self) -> dict[str, Any]:
        return {
            "horizon": self.horizon,
            "url": self.url,
            "timeout_s": self.timeout_s,
            "model": self.model,
            "fallback": self.fallback.name,
        }

    def fit(self, history: pd.DataFrame) -> Self:
        """The remote model is trained elsewhere; this fits the local fallback."""
        self.fallback.fit(history)
        return self

    # ---- the estimator interface -----------------------------------------------------------
    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        """The service's prediction, or the fallback's if it cannot give one in time."""
        if batch.size == 0:
            return self.fallback.predict(batch, survival=survival)
        now = time.monotonic()
        if now < self._open_until:
            self._counts["skipped"] += 1
            return self._fall_back(batch, survival)
        self._counts["calls"] += 1
        try:
            self._flush(now + self.timeout_s)
            pred = self._remote_predict(batch, survival, now + self.timeout_s)
        except RemoteFailure as exc:
            self._failed(exc)
            return self._fall_back(batch, survival)
        except Exception as exc:  # never raise into the router, whatever went wrong
            self._failed(RemoteFailure(f"unexpected_{type(exc).__name__}", str(exc)))
            return self._fall_back(batch, survival)
        self._failures = 0
        self._counts["ok"] += 1
        self._latency_ms.append((time.monotonic() - now) * 1e3)
        return pred

    def observe(self, completions: CompletedBatch) -> None:
        """Feed the local fallback now; queue the completions for the service's next call."""
        self.fallback.observe(completions)
        if completions.size == 0 or self.max_pending == 0:
            return
        self._pending.append(completions)
        self._pending_rows += completions.size
        while self._pending_rows > self.max_pending:
            dropped = self._pending.popleft()
            self._pending_rows -= dropped.size
            self._counts["observe_dropped"] += dropped.size

    def stats(self) -> dict[str, Any]:
        """Counters for the run summary: calls, fallbacks, errors by kind, latency."""
        lat = np.asarray(self._latency_ms, dtype=np.float64)
        c = self._counts
        return {
            "remote_url": self.url,
            "remote_calls": c["calls"],
            "remote_ok": c["ok"],
            "remote_fallbacks": c["fallbacks"],
            "remote_skipped": c["skipped"],
            "remote_errors_by_kind": dict(sorted(self._errors.items())),
            "remote_last_error": self.last_error_,
            "remote_latency_ms_p50": float(np.percentile(lat, 50)) if lat.size else None,
            "remote_latency_ms_p99": float(np.percentile(lat, 99)) if lat.size else None,
            "remote_observed": c["observed"],
            "remote_observe_dropped": c["observe_dropped"],
            "remote_observe_pending": self._pending_rows,
            "remote_model": self.remote_model_,
            "remote_fallback_estimator": self.fallback.name,
        }

    # ---- internals -------------------------------------------------------------------------
    def _fall_back(self, batch: RunningBatch, survival: bool) -> Prediction:
        self._counts["fallbacks"] += 1
        return self.fallback.predict(batch, survival=survival)

    def _failed(self, exc: RemoteFailure) -> None:
        self._errors[exc.kind] += 1
        self.last_error_ = str(exc)
        self._failures += 1
        first, longest = BACKOFF_S
        pause = min(longest, first * 2 ** (self._failures - 1))
        self._open_until = time.monotonic() + pause

    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        if self._client is None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise RemoteFailure("config", f"not an http(s) URL: {self.url}")
            cls = (
                http.client.HTTPSConnection
                if parts.scheme == "https"
                else http.client.HTTPConnection
            )
            self._client = cls(parts.hostname, parts.port, timeout=timeout)
            self._prefix = parts.path.rstrip("/")
        return self._client

    def _post(self, path: str, body: dict[str, Any], deadline: float) -> bytes:
        """POST within the budget; a kept-alive connection the server closed is retried once."""
        payload = orjson.dumps(body)
        headers = {"content-type": "application/json"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        for attempt in (0, 1):
            left = deadline - time.monotonic()
            if left <= 0:
                raise RemoteFailure("timeout", "budget spent before the call")
            conn = self._connection(left)
            reused = conn.sock is not None
            try:
                if not reused:
                    conn.timeout = left
                    conn.connect()
                conn.sock.settimeout(left)
                conn.request("POST", self._prefix + path, body=payload, headers=headers)
                resp = conn.getresponse()
                content = resp.read()
                break
            except (OSError, http.client.HTTPException) as exc:
                self.close()  # a half-used connection is not reused
                stale = isinstance(exc, _STALE) and reused and attempt == 0
                if not stale:
                    kind = _failure_kind(exc)
                    raise RemoteFailure(kind, f"{type(exc).__name__}: {exc}") from None
        if resp.status // 100 != 2:
            raise RemoteFailure(f"http_{resp.status}", content[:200].decode(errors="replace"))
        return content

    def _flush(self, deadline: float) -> None:
        if not self._pending:
            return
        batches = list(self._pending)
        cols = [
            np.concatenate([getattr(b, f) for b in batches]).tolist()
            for f in ("prompt_tokens", "output_tokens")
        ]
        keys = np.concatenate([_keys(b.prompt_key, b.size) for b in batches]).tolist()
        times = np.concatenate(
            [b.time_s if b.time_s is not None else np.full(b.size, np.nan) for b in batches]
        ).tolist()
        rows = [
            {"prompt_tokens": p, "output_tokens": o, "prompt_key": k}
            | ({} if t != t else {"time_s": t})
            for p, o, k, t in zip(cols[0], cols[1], keys, times, strict=True)
        ]
        self._post("/v1/observe", {"completions": rows}, deadline)
        self._pending.clear()
        self._counts["observed"] += self._pending_rows
        self._pending_rows = 0

    def _remote_predict(self, batch: RunningBatch, survival: bool, deadline: float) -> Prediction:
        n = batch.size
        rows = [
            {"id": i, "prompt_tokens": p, "age": a, "prompt_key": k}
            for i, p, a, k in zip(
                range(n),
                np.asarray(batch.prompt_tokens).tolist(),
                np.asarray(batch.age).tolist(),
                _keys(batch.prompt_key, n).tolist(),
                strict=True,
            )
        ]
        body: dict[str, Any] = {"requests": rows, "survival": survival, "horizon": self.horizon}
        if batch.time_s is not None and np.isfinite(batch.time_s):
            body["time_s"] = float(batch.time_s)
        if self.model is not None:
            body["model"] = self.model
        return self._parse(self._post("/v1/predict", body, deadline), n, survival)

    def _parse(self, content: bytes, n: int, survival: bool) -> Prediction:
        h = self.horizon
        try:
            data = orjson.loads(content)
            p = np.asarray(data["p_finish"], dtype=np.float64)
            c = np.asarray(data["c"], dtype=np.float64)
            horizon = data["horizon"]
            curves = data.get("survival") if survival else None
            surv = None if curves is None else np.asarray(curves, dtype=np.float64)
            model = data.get("model")
        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
            raise RemoteFailure("malformed", f"{type(exc).__name__}: {exc}") from None
        if horizon != h:
            raise RemoteFailure("horizon", f"answered for horizon {horizon}, asked {h}")
        pred = Prediction(p_finish=p, c=c, survival=surv)
        problem = prediction_problem(pred, n, h)
        if problem is not None:
            raise RemoteFailure("malformed", f"the answer {problem}")
        if isinstance(model, dict):
            self.remote_model_ = model
        return pred


def check_service_url(url: str) -> str:
    """``url`` if it can name a prediction service (http or https, a host, a port in range);
    a UserError saying what is wrong otherwise."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UserError(f"--estimator-url '{url}': {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UserError(
            f"--estimator-url '{url}' is not an http(s) URL such as http://127.0.0.1:8080"
        )
    if port is not None and not 1 <= port <= 65535:
        raise UserError(f"--estimator-url '{url}': port {port} is out of range 1..65535")
    return url


PREFLIGHT_TIMEOUT_S = 5.0


def preflight(url: str, token: str | None = None, timeout_s: float = PREFLIGHT_TIMEOUT_S) -> None:
    """Ask the service for its models once before a replay: a UserError when it cannot be
    reached or refuses the token, so a run is not silently answered by the fallback."""
    check_service_url(url)
    token = token if token is not None else (os.environ.get(TOKEN_ENV) or None)
    parts = urlsplit(url)
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=timeout_s)
    headers = {"authorization": f"Bearer {token}"} if token else {}
    try:
        conn.request("GET", parts.path.rstrip("/") + "/v1/models", headers=headers)
        resp = conn.getresponse()
        resp.read()
    except (OSError, http.client.HTTPException) as exc:
        raise UserError(f"cannot reach the prediction service at {url} ({exc})") from None
    finally:
        conn.close()
    if resp.status == 401:
        raise UserError(
            f"the prediction service at {url} refused the call (401): set {TOKEN_ENV} to its token"
        )
    if resp.status // 100 != 2:
        raise UserError(f"the prediction service at {url} answered {resp.status} to GET /v1/models")


def _failure_kind(exc: BaseException) -> str:
    """``timeout``, ``connect`` (refused or unreachable) or ``transport`` (anything else)."""
    if isinstance(exc, TimeoutError | socket.timeout):
        return "timeout"
    if isinstance(exc, ConnectionRefusedError | socket.gaierror):
        return "connect"
    return "transport"


def _keys(keys: np.ndarray | None, n: int) -> np.ndarray:
    return np.zeros(n, dtype=np.uint64) if keys is None else np.asarray(keys, dtype=np.uint64)

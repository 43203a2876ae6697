"""Raw HTTP to a rank or the gateway: one request, a stream read to its end, metrics."""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class Stream:
    """What one SSE stream delivered: the data events, whether it ended with [DONE], errors."""

    status: int
    headers: dict[str, str]
    events: list[dict[str, Any]] = field(default_factory=list)
    done: bool = False
    errors: list[dict[str, Any]] = field(default_factory=list)
    failure: str | None = None
    stopped: bool = False  # the caller's ``until`` ended it before its end

    @property
    def text(self) -> str:
        """The generated text, all choices joined."""
        out = []
        for e in self.events:
            for c in e.get("choices") or []:
                out.append(c.get("text") or (c.get("delta") or {}).get("content") or "")
        return "".join(out)

    @property
    def finish_reasons(self) -> list[str]:
        """Every non-null finish_reason the stream carried."""
        return [c["finish_reason"] for e in self.events for c in e.get("choices") or []
                if c.get("finish_reason")]  # fmt: skip

    @property
    def usage(self) -> dict[str, Any] | None:
        """The last usage object the stream carried."""
        found = [e["usage"] for e in self.events if e.get("usage")]
        return found[-1] if found else None


@contextmanager
def held(url: str, payload: dict[str, Any], count: int,
         timeout_s: float = 300.0) -> Iterator[list[cf.Future]]:  # fmt: skip
    """``count`` streams of ``payload`` running on threads while the block runs (the futures of
    their :class:`Stream`); when it ends they are closed (``stopped``) and waited for."""
    until = threading.Event()
    pool = cf.ThreadPoolExecutor(count)
    futures = [pool.submit(stream, url, payload, timeout_s=timeout_s, until=until)
               for _ in range(count)]  # fmt: skip
    try:
        yield futures
    finally:
        until.set()
        for f in futures:
            f.result()
        pool.shutdown()


def body(model: str, max_tokens: int = 8, **extra: Any) -> dict[str, Any]:
    """A completion request of exactly ``max_tokens`` tokens (``ignore_eos``), greedy."""
    return {"model": model, "prompt": "hello world the quick brown fox", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, **extra}  # fmt: skip


def stream(url: str, payload: dict[str, Any], *, path: str = "/v1/completions",
           headers: dict[str, str] | None = None, timeout_s: float = 60.0,
           on_event: Any = None, until: threading.Event | None = None) -> Stream:  # fmt: skip
    """POST a streaming request and read it to its end, or until ``timeout_s`` (a failure), or
    until ``until`` is set (the connection closed after the next line: ``stopped``)."""
    payload = {**payload, "stream": True}
    timeout = httpx.Timeout(timeout_s, connect=5.0)
    try:
        with httpx.stream("POST", url + path, json=payload, headers=headers or {},
                          timeout=timeout) as r:  # fmt: skip
            out = Stream(r.status_code, dict(r.headers))
            if r.status_code != 200:
                r.read()
                out.failure = r.text
                return out
            kind = "message"
            for line in r.iter_lines():
                if until is not None and until.is_set():
                    out.stopped = True
                    return out
                if line.startswith("event:"):
                    kind = line.split(":", 1)[1].strip()
                    continue
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    out.done = True
                    continue
                event = json.loads(data)
                if kind == "error" or "error" in event:
                    out.errors.append(event)
                else:
                    out.events.append(event)
                    if on_event is not None:
                        on_event(event)
                kind = "message"
            return out
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        out = locals().get("out") or Stream(0, {})
        out.failure = f"{type(exc).__name__}: {exc}"
        return out


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)$")


def metric(text: str, name: str, **labels: str) -> float:
    """The sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        m = _SAMPLE.match(line.strip())
        if not m or m.group(1) != name:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2) or ""))
        if all(got.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total

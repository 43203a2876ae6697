"""What the benchmark will send: one planned request per trace row (time, target, body).

Requests go out at the trace's arrival times (first arrival at 0) divided by the rate scale,
round-robin over the URLs in trace order. Each carries a prompt of the trace's prompt length
built by :mod:`balanceroute.features.prompts` (text for the emulator's whitespace tokenizer, or
token ids for exact lengths on a real engine), ``max_tokens`` = the trace's output length with
``ignore_eos: true`` and ``stream: true`` (usage requested in the last chunk), as
``vllm bench serve`` replays traces.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import orjson
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.prompts import build_prompt, build_prompt_ids

ENDPOINTS = {"completions": "/v1/completions", "chat": "/v1/chat/completions"}
PROMPT_FORMATS = ("text", "ids")


@dataclass(frozen=True, slots=True)
class Target:
    """One endpoint: the POST URL, its kind, and the rank's base URL."""

    base: str
    url: str
    endpoint: str


def resolve_targets(urls: list[str], endpoint: str) -> list[Target]:
    """POST URLs from base URLs (``http://host:port``) or full endpoint URLs."""
    if not urls:
        raise UserError("give at least one --url")
    if endpoint not in ENDPOINTS:
        raise UserError(f"unknown endpoint '{endpoint}'; known: {', '.join(ENDPOINTS)}")
    out = []
    for raw in urls:
        url = raw.rstrip("/")
        if not url.startswith(("http://", "https://")):
            raise UserError(f"--url must start with http:// or https://, got '{raw}'")
        kind = endpoint
        for name, path in ENDPOINTS.items():
            if url.endswith(path):
                kind, url = name, url[: -len(path)]
                break
        else:
            if url.endswith("/v1"):
                url = url[:-3]
        out.append(Target(base=url, url=url + ENDPOINTS[kind], endpoint=kind))
    return out


@dataclass(slots=True)
class Plan:
    """Planned requests in send order (arrays indexed by request)."""

    send_s: np.ndarray  # float64, seconds after the start
    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    prompt_key: list[str | None]
    trace_index: np.ndarray  # int64 row of the (sorted) trace
    target: np.ndarray  # int64 index into targets
    targets: list[Target]
    model: str | None
    prompt_format: str = "text"
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def size(self) -> int:
        return int(self.send_s.shape[0])

    def request_id(self, i: int) -> str:
        """The ``x-request-id`` of request ``i`` (the emulator logs it)."""
        return f"bench-{i}"

    def body(self, i: int) -> bytes:
        """The JSON body of request ``i`` (built when sent: prompts are not kept in memory)."""
        n = int(self.prompt_tokens[i])
        key = self.prompt_key[i]
        target = self.targets[int(self.target[i])]
        payload: dict[str, Any] = {}
        if self.model is not None:
            payload["model"] = self.model
        if target.endpoint == "chat":
            payload["messages"] = [{"role": "user", "content": build_prompt(n, key)}]
        elif self.prompt_format == "ids":
            payload["prompt"] = build_prompt_ids(n, key)
        else:
            payload["prompt"] = build_prompt(n, key)
        payload.update(
            max_tokens=int(self.output_tokens[i]),
            ignore_eos=True,
            stream=True,
            stream_options={"include_usage": True},
        )
        return orjson.dumps(payload)


def make_plan(
    frame: pd.DataFrame,
    targets: list[Target],
    *,
    rate_scale: float,
    model: str | None,
    prompt_format: str = "text",
) -> Plan:
    """A plan from a validated trace (sorted by arrival)."""
    if not rate_scale > 0:
        raise UserError(f"rate scale must be > 0, got {rate_scale}")
    if prompt_format not in PROMPT_FORMATS:
        raise UserError(f"unknown prompt format '{prompt_format}'; known: text, ids")
    if prompt_format == "ids" and any(t.endpoint == "chat" for t in targets):
        raise UserError("token-id prompts need the completions endpoint, not chat")
    arrival = frame["arrival_s"].to_numpy(dtype=np.float64)
    n = arrival.shape[0]
    keys = frame["prompt_key"]
    return Plan(
        send_s=(arrival - arrival[0]) / rate_scale,
        prompt_tokens=frame["prompt_tokens"].to_numpy(dtype=np.int64),
        output_tokens=frame["output_tokens"].to_numpy(dtype=np.int64),
        prompt_key=[None if pd.isna(k) else str(k) for k in keys],
        trace_index=np.arange(n, dtype=np.int64),
        target=np.arange(n, dtype=np.int64) % len(targets),
        targets=targets,
        model=model,
        prompt_format=prompt_format,
    )

"""Answers through the gateway carry what vLLM's own answers carry."""

from __future__ import annotations

from typing import Any

import httpx

from tests.conformance.engine import Engine
from tests.conformance.processes import Gateway
from tests.conformance.shapes import error_of
from tests.conformance.wire import body, stream


def _post(url: str, payload: dict[str, Any], path: str = "/v1/completions",
          headers: dict[str, str] | None = None) -> httpx.Response:  # fmt: skip
    return httpx.post(url + path, json=payload, headers=headers or {}, timeout=60)


def _missing(want: Any, got: Any, where: str = "") -> list[str]:
    """Paths of the fields of ``want`` that ``got`` lacks, or has null where ``want`` has a value."""
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return [where or "."]
        out = [f"{where}.{k}" for k in want if k not in got]
        for k, v in want.items():
            if v is not None:
                out += _missing(v, got.get(k), f"{where}.{k}")
        return out
    if isinstance(want, list) and want:
        if not isinstance(got, list) or len(got) != len(want):
            return [where]
        return [p for w, g in zip(want, got, strict=True) for p in _missing(w, g, f"{where}[]")]
    return [where] if got is None else []


def test_non_streaming_completion_keeps_vllms_fields(engine: Engine, gateway: Gateway) -> None:
    """Every field vLLM sends (logprobs when asked, token_ids, ...) comes through the gateway."""
    payload = body(engine.model, logprobs=2, return_token_ids=True)
    want = _post(engine.ranks[0], payload).json()
    got = _post(gateway.url, payload).json()
    assert want["choices"][0]["logprobs"], want  # the engine did answer with logprobs
    assert not _missing(want, got), (_missing(want, got), got)


def test_non_streaming_chat_keeps_vllms_fields(engine: Engine, gateway: Gateway) -> None:
    """A chat answer with logprobs keeps every field vLLM sends."""
    payload = {"model": engine.model, "messages": [{"role": "user", "content": "hello"}],
               "max_tokens": 4, "ignore_eos": True, "temperature": 0.0, "logprobs": True,
               "top_logprobs": 2}  # fmt: skip
    want = _post(engine.ranks[0], payload, "/v1/chat/completions").json()
    got = _post(gateway.url, payload, "/v1/chat/completions").json()
    assert want["choices"][0]["logprobs"], want
    assert not _missing(want, got), (_missing(want, got), got)


def _served_like_vllm(engine: Engine, gateway: Gateway, payload: dict[str, Any]) -> None:
    """Either the same number of choices as vLLM gives, or vLLM's 400 body with a reason."""
    want = _post(engine.ranks[0], payload)
    assert want.status_code == 200, want.text[:300]
    got = _post(gateway.url, payload)
    if got.status_code == 200:
        assert len(got.json()["choices"]) == len(want.json()["choices"]), got.text[:500]
        return
    assert got.status_code == 400, got.text[:300]
    assert error_of(got)["message"]


def test_n_above_one(engine: Engine, gateway: Gateway) -> None:
    """``n = 2`` is served with two choices, or refused with vLLM's 400 and a reason."""
    _served_like_vllm(engine, gateway, body(engine.model, n=2, temperature=1.0, seed=1))


def test_batch_prompts(engine: Engine, gateway: Gateway) -> None:
    """A list of two prompts is served with two choices, or refused with vLLM's 400."""
    _served_like_vllm(engine, gateway, {**body(engine.model), "prompt": ["hello", "world"]})


def test_request_id_both_ways(engine: Engine, gateway: Gateway) -> None:
    """``x-request-id`` comes back as a header, and reaches the rank (its id carries it)."""
    rid = "conformance-rid-1"
    direct = _post(engine.ranks[0], body(engine.model), headers={"x-request-id": rid})
    assert rid in direct.json()["id"], direct.json()["id"]  # vLLM builds its id from the header
    via = _post(gateway.url, body(engine.model), headers={"x-request-id": rid})
    assert via.headers.get("x-request-id") == rid, dict(via.headers)
    assert via.json()["id"] == direct.json()["id"], (via.json()["id"], direct.json()["id"])


def test_request_id_reaches_the_rank_in_streams(engine: Engine, gateway: Gateway) -> None:
    """In a stream, every chunk's id is the rank's, built from ``x-request-id``."""
    rid = "conformance-rid-2"
    s = stream(gateway.url, body(engine.model), headers={"x-request-id": rid})
    assert s.done and s.events, s.failure
    assert s.headers.get("x-request-id") == rid, s.headers
    assert all(rid in e["id"] for e in s.events), {e["id"] for e in s.events}


def test_usage_equals_vllms(engine: Engine, gateway: Gateway) -> None:
    """Non-streaming and streaming usage through the gateway equals vLLM's for the same request."""
    payload = body(engine.model, max_tokens=12)
    want = _post(engine.ranks[0], payload).json()["usage"]
    got = _post(gateway.url, payload).json()["usage"]
    keys = ("prompt_tokens", "completion_tokens", "total_tokens")
    assert {k: got[k] for k in keys} == {k: want[k] for k in keys}
    s = stream(gateway.url, {**payload, "stream_options": {"include_usage": True}})
    assert s.done and s.usage, s.failure
    assert {k: s.usage[k] for k in keys} == {k: want[k] for k in keys}


def test_streamed_tokens_equal_max_tokens(engine: Engine, gateway: Gateway) -> None:
    """With ignore_eos a stream gives exactly max_tokens tokens (usage and token count)."""
    payload = body(engine.model, max_tokens=40, return_token_ids=True,
                   stream_options={"include_usage": True})  # fmt: skip
    s = stream(gateway.url, payload)
    assert s.done and s.usage, s.failure
    assert s.usage["completion_tokens"] == 40
    assert s.finish_reasons == ["length"]

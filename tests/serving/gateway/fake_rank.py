"""A small vLLM-like rank for the gateway's fault tests: ``python -m tests.serving.gateway.fake_rank
PORT [--key KEY]``. It streams vLLM's completion chunks (``logprobs`` when asked, ``token_ids``,
``stop_reason``, ``system_fingerprint``, the id built from ``x-request-id``) and misbehaves on cue,
by the prompt: ``abort-before`` (the first such request ends with ``finish_reason`` ``abort``
before any token, as vLLM does when it stops), ``empty-before`` (the first such request gets a
usage chunk and ``[DONE]`` with no token and no finish reason, as a vLLM rank stopped by SIGTERM
answered one in a conformance run), ``abort-mid`` (two tokens, then ``abort``),
``hang-before`` (the first such request never sends a token), ``hang-mid`` (two tokens, then
silence), ``plain`` (chunks as vLLM sends them with only ``include_usage``: no usage in a token
chunk, the final usage chunk only when asked; written in uneven pieces that cut events, several
events in one piece); ``POST /control {"health": "ok" | "fail" | "flaky"}`` sets what ``/health`` answers
(``flaky``: 503 every other call); with ``--key`` every ``/v1`` call without that bearer key is a 401;
with ``--break reset`` every stream's connection is closed after 3 token chunks, with ``--break
garbage`` every stream carries a chunk that is not JSON after 2 (and ends well), while ``/health``
answers 200."""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from aiohttp import web

MODEL = "fake"
seen = {"abort-before": 0, "hang-before": 0, "empty-before": 0}
HANG_S = 120.0


def _chunk(rid: str, text: str, reason: str | None, n: int, prompt: int, logprobs: int | None,
           token: int | None) -> bytes:  # fmt: skip
    choice: dict[str, Any] = {"index": 0, "text": text, "logprobs": None, "finish_reason": reason,
                              "stop_reason": None, "token_ids": [token] if token is not None else []}  # fmt: skip
    if logprobs is not None and token is not None:
        choice["logprobs"] = {"text_offset": [n], "token_logprobs": [-0.5], "tokens": [text],
                              "top_logprobs": [{text: -0.5}]}  # fmt: skip
    obj = {"id": rid, "object": "text_completion", "created": 1700000000, "model": MODEL,
           "system_fingerprint": "fp-fake", "choices": [choice],
           "usage": {"prompt_tokens": prompt, "completion_tokens": n,
                     "total_tokens": prompt + n}}  # fmt: skip
    return b"data: " + orjson.dumps(obj) + b"\n\n"


async def completions(request: web.Request) -> web.StreamResponse:
    key = request.app["key"]
    if key is not None and request.headers.get("authorization") != f"Bearer {key}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    body = await request.json()
    prompt = str(body.get("prompt"))
    rid = "cmpl-" + request.headers.get("x-request-id", "x")
    want = int(body.get("max_tokens") or 16)
    logprobs = body.get("logprobs")
    resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
    await resp.prepare(request)
    if "abort-before" in prompt and seen["abort-before"] == 0:
        seen["abort-before"] += 1
        await resp.write(_chunk(rid, "", "abort", 0, 3, None, None) + b"data: [DONE]\n\n")
        return resp
    if "empty-before" in prompt and seen["empty-before"] == 0:  # a usage chunk, then [DONE]
        seen["empty-before"] += 1
        usage = {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3}
        await resp.write(b"data: " + orjson.dumps({"id": rid, "object": "text_completion",
                         "choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n")  # fmt: skip
        return resp
    if "hang-before" in prompt and seen["hang-before"] == 0:
        seen["hang-before"] += 1
        await asyncio.sleep(HANG_S)
    if "plain" in prompt:
        await _plain(resp, rid, want, body)
        return resp
    cut = 2 if "abort-mid" in prompt else None
    breaks = request.app["break"]
    for n in range(1, want + 1):
        await asyncio.sleep(0.005)
        if breaks == "reset" and n == 4:
            assert request.transport is not None
            request.transport.close()  # the stream cut without its last chunk or [DONE]
            return resp
        if breaks == "garbage" and n == 3:
            await resp.write(b"data: {this is not json\n\n")
        if "hang-mid" in prompt and n == 3:
            await asyncio.sleep(HANG_S)
        if cut is not None and n > cut:
            await resp.write(_chunk(rid, "", "abort", n - 1, 3, None, None))
            break
        await resp.write(_chunk(rid, " t", "length" if n == want else None, n, 3, logprobs, n))
    await resp.write(b"data: [DONE]\n\n")
    return resp


async def _plain(resp: web.StreamResponse, rid: str, want: int, body: dict[str, Any]) -> None:
    """``want`` token chunks (and the usage chunk when asked) in pieces of 1 to 300 bytes."""
    out = b""
    for n in range(1, want + 1):
        choice = {"index": 0, "text": f" w{n}", "logprobs": None,
                  "finish_reason": "length" if n == want else None, "stop_reason": None}  # fmt: skip
        obj = {"id": rid, "object": "text_completion", "created": 1700000000, "model": MODEL,
               "choices": [choice]}  # fmt: skip
        out += b"data: " + orjson.dumps(obj) + b"\n\n"
    if (body.get("stream_options") or {}).get("include_usage"):
        usage = {"prompt_tokens": 3, "completion_tokens": want, "total_tokens": 3 + want}
        obj = {"id": rid, "object": "text_completion", "created": 1700000000, "model": MODEL,
               "choices": [], "usage": usage}  # fmt: skip
        out += b"data: " + orjson.dumps(obj) + b"\n\n"
    out += b"data: [DONE]\n\n"
    sizes = [1, 7, 300, 45, 120, 2, 260, 33]
    i = k = 0
    while i < len(out):
        await resp.write(out[i : i + sizes[k % len(sizes)]])
        i += sizes[k % len(sizes)]
        k += 1
        await asyncio.sleep(0.002)


async def health(request: web.Request) -> web.Response:
    mode = request.app["health"]
    request.app["health_calls"] += 1
    if mode == "fail" or (mode == "flaky" and request.app["health_calls"] % 2 == 0):
        return web.Response(status=503, text="sick")
    return web.Response(text="")


async def control(request: web.Request) -> web.Response:
    request.app["health"] = (await request.json())["health"]
    return web.Response(text="ok")


async def models(request: web.Request) -> web.Response:
    key = request.app["key"]
    if key is not None and request.headers.get("authorization") != f"Bearer {key}":
        return web.json_response({"error": "Unauthorized"}, status=401)
    return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                          "created": int(time.time())}]})  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", type=int)
    parser.add_argument("--key")
    parser.add_argument("--break", dest="breaks", choices=["reset", "garbage"])
    args = parser.parse_args()
    app = web.Application()
    app["key"], app["break"] = args.key, args.breaks
    app["health"], app["health_calls"] = "ok", 0
    app.router.add_post("/control", control)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()

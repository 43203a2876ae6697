"""The async streaming client: one POST, its SSE stream read as it arrives, one record.

Parsing follows the OpenAI stream vLLM and SGLang send: ``data: {json}`` events separated by a
blank line, ``data: [DONE]`` at the end, ``: comments`` ignored. A *token event* is a chunk
whose first choice carries text (``choices[0].text`` for completions, ``delta.content`` for
chat; vLLM's chat role chunk with empty content is not a token). TTFT is the first token event's
arrival minus the moment the request was sent, ITLs are the gaps between token events, E2E is
the last token event's arrival (as ``vllm bench serve`` measures). The output token count is the
``usage.completion_tokens`` of the last chunk when the server sends it, else the number of
token events. A request succeeds when it got status 200, at least one token, ``[DONE]`` and a
``stop`` or ``length`` finish (what it asked for: bench sends ``max_tokens`` with ``ignore_eos``);
a stream the server ended otherwise (vLLM's ``abort`` when it stops) is a failure naming the
finish reason, and anything else keeps its error message.
"""

from __future__ import annotations

import asyncio
import time
from array import array

import aiohttp
import orjson

from balanceroute.serving.openai.sse import DONE_PAYLOAD, EventSplitter, data_payload, token_text

WHOLE = {"stop", "length", None}  # None: a server that sends no finish reason (then [DONE] is all)


class RequestRecord:
    """What one request measured (times in seconds, relative to the benchmark start)."""

    __slots__ = (
        "done",
        "error",
        "finish_reason",
        "index",
        "n_tokens",
        "queue_s",
        "start_s",
        "status",
        "token_s",
        "usage_completion",
        "usage_prompt",
    )

    def __init__(self, index: int) -> None:
        self.index = index
        self.start_s = float("nan")
        self.queue_s = 0.0
        self.status = 0
        self.token_s = array("d")  # arrival of each token event, relative to start_s
        self.n_tokens = 0
        self.usage_completion = -1
        self.usage_prompt = -1
        self.done = False
        self.error = ""
        self.finish_reason: str | None = None

    @property
    def success(self) -> bool:
        return not self.error and self.done and self.n_tokens > 0


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: bytes,
    headers: dict[str, str],
    record: RequestRecord,
    t0: float,
    timeout_s: float,
) -> None:
    """POST ``body`` to ``url`` and fill ``record`` (never raises, except cancellation)."""
    clock = time.perf_counter
    start = clock()
    record.start_s = start - t0
    times = record.token_s
    try:
        async with asyncio.timeout(timeout_s):
            async with session.post(url, data=body, headers=headers) as resp:
                record.status = resp.status
                if resp.status != 200:
                    text = (await resp.text(errors="replace"))[:300]
                    record.error = f"HTTP {resp.status}: {text}"
                    return
                splitter = EventSplitter()
                async for data in resp.content.iter_any():
                    now = clock()
                    for event in splitter.feed(data):
                        payload = data_payload(event)
                        if payload is None:
                            continue  # comments (": ping") and empty events
                        if payload == DONE_PAYLOAD:
                            record.done = True
                            continue
                        obj = orjson.loads(payload)
                        choices = obj.get("choices")
                        if choices and token_text(choices[0]) is not None:
                            times.append(now - start)
                        if choices and choices[0].get("finish_reason") is not None:
                            record.finish_reason = str(choices[0]["finish_reason"])
                        usage = obj.get("usage")
                        if usage:
                            record.usage_completion = int(usage.get("completion_tokens") or 0)
                            record.usage_prompt = int(usage.get("prompt_tokens") or 0)
                        if obj.get("error"):
                            record.error = f"error event: {str(obj['error'])[:300]}"
                if not record.done and not record.error:
                    record.error = "stream ended before data: [DONE]"
                if not record.error and record.finish_reason not in WHOLE:
                    record.error = (
                        f"finish_reason {record.finish_reason!r}: the output was cut short"
                    )
    except asyncio.CancelledError:
        record.error = "cancelled: the run's time limit was reached"
        raise
    except TimeoutError:
        record.error = f"timed out after {timeout_s:g} s"
    except aiohttp.ClientError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    except (ValueError, orjson.JSONDecodeError) as exc:
        record.error = f"bad stream data: {exc}"[:300]
    except OSError as exc:
        record.error = f"{type(exc).__name__}: {exc}"[:300]
    finally:
        record.n_tokens = record.usage_completion if record.usage_completion >= 0 else len(times)

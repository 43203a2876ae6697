"""Answers in the OpenAI format: the usage, a non-streaming answer and vLLM's error body
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

import orjson

# The error type of a status when the caller names none (the gateway's answers).
ERROR_TYPES = {429: "RateLimitError", 502: "BadGatewayError", 503: "ServiceUnavailableError"}


def error_body(status: int, message: str, type_: str | None = None) -> bytes:
    """vLLM's (and OpenAI's) error body; ``type_`` defaults by status (else ``APIError``)."""
    kind = type_ if type_ is not None else ERROR_TYPES.get(status, "APIError")
    return orjson.dumps(
        {"error": {"message": message, "type": kind, "param": None, "code": status}}
    )


def usage(prompt: int, completion: int) -> dict[str, int]:
    """The ``usage`` object of an answer or of the last chunk."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def whole_choice(chat: bool, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One choice of a non-streaming answer."""
    choice: dict[str, Any] = {"index": index}
    if chat:
        choice["message"] = {"role": "assistant", "content": text}
    else:
        choice["text"] = text
    choice["logprobs"] = None
    choice["finish_reason"] = finish_reason
    return choice


def whole_answer(
    chat: bool,
    rid: str,
    created: int,
    model: str | None,
    choices: list[dict[str, Any]],
    prompt: int,
    completion: int,
) -> dict[str, Any]:
    """A non-streaming answer: ``chat.completion`` or ``text_completion``."""
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        "usage": usage(prompt, completion),
    }

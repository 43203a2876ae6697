"""Answers in the OpenAI format: the usage, a non-streaming answer and vLLM's error body
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

from typing import Any

import orjson

# The error type of a status when the caller names none (the gateway's answers); vLLM's own
# ``create_error_response`` says ``BadRequestError`` for a 400, its HTTP errors the status phrase.
ERROR_TYPES = {
    400: "BadRequestError",
    401: "Unauthorized",
    403: "Forbidden",
    404: "NotFoundError",
    413: "Request Entity Too Large",
    429: "RateLimitError",
    500: "InternalServerError",
    502: "BadGatewayError",
    503: "ServiceUnavailableError",
}


def error_object(
    status: int, message: str, type_: str | None = None, param: str | None = None
) -> dict[str, Any]:
    """vLLM's (and OpenAI's) error object ``{"error": {"message", "type", "param", "code"}}``;
    ``type_`` defaults by status (else ``APIError``)."""
    kind = type_ if type_ is not None else ERROR_TYPES.get(status, "APIError")
    return {"error": {"message": message, "type": kind, "param": param, "code": status}}


def error_body(
    status: int, message: str, type_: str | None = None, param: str | None = None
) -> bytes:
    """:func:`error_object` as JSON bytes."""
    return orjson.dumps(error_object(status, message, type_, param))


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

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


# vLLM's non-streaming answers (0.32, its response models) carry these fields even when null; a
# stream's chunks leave most of them out. Both the emulator's answers and the gateway's assembled
# ones start from them, so a client reading an answer finds every key vLLM's own answer has.
USAGE_NULLS: dict[str, Any] = {"prompt_tokens_details": None, "completion_tokens_details": None}
TOP_NULLS: dict[str, Any] = {"service_tier": None, "system_fingerprint": None}
TAIL_NULLS: dict[str, Any] = {"kv_transfer_params": None, "ec_transfer_params": None,
                              "metrics": None}  # fmt: skip
CHAT_TAIL_NULLS: dict[str, Any] = {"prompt_logprobs": None, "prompt_token_ids": None,
                                   "prompt_text": None, **TAIL_NULLS}  # fmt: skip
CHOICE_NULLS: dict[str, Any] = {"logprobs": None, "finish_reason": None, "stop_reason": None,
                                "token_ids": None}  # fmt: skip
TEXT_CHOICE_NULLS: dict[str, Any] = {**CHOICE_NULLS, "prompt_logprobs": None,
                                     "prompt_token_ids": None, "routed_experts": None}  # fmt: skip
CHAT_CHOICE_NULLS: dict[str, Any] = {**CHOICE_NULLS, "routed_experts": None}
MESSAGE_NULLS: dict[str, Any] = {"refusal": None, "annotations": None, "audio": None,
                                 "function_call": None, "reasoning": None}  # fmt: skip


def usage(prompt: int, completion: int) -> dict[str, int]:
    """The ``usage`` object of an answer or of the last chunk."""
    return {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
    }


def whole_usage(given: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming answer's ``usage``: ``given`` with vLLM's null details it lacks."""
    return {**given, **{k: v for k, v in USAGE_NULLS.items() if k not in given}}


def whole_choice(chat: bool, index: int, text: str, finish_reason: str | None) -> dict[str, Any]:
    """One choice of a non-streaming answer, with every field of vLLM's."""
    choice: dict[str, Any] = {"index": index}
    if chat:
        choice["message"] = {"role": "assistant", "content": text, **MESSAGE_NULLS}
    else:
        choice["text"] = text
    choice.update(CHAT_CHOICE_NULLS if chat else TEXT_CHOICE_NULLS)
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
    """A non-streaming answer, ``chat.completion`` or ``text_completion``, in vLLM's shape."""
    return {
        "id": rid,
        "object": "chat.completion" if chat else "text_completion",
        "created": created,
        "model": model,
        "choices": choices,
        **TOP_NULLS,
        "usage": whole_usage(usage(prompt, completion)),
        **(CHAT_TAIL_NULLS if chat else TAIL_NULLS),
    }

"""Request bodies, answers and the error body of the OpenAI wire format."""

from __future__ import annotations

import orjson
import pytest
from pydantic import ValidationError

from balanceroute.serving.openai.requests import (
    ChatBody,
    CompletionBody,
    CompletionRequest,
    prompt_batch,
)
from balanceroute.serving.openai.responses import error_body, usage, whole_answer, whole_choice


def test_a_prompt_is_one_text_or_token_list_or_a_batch_of_them() -> None:
    assert prompt_batch("hi") == ["hi"]
    assert prompt_batch([1, 2]) == [[1, 2]]
    assert prompt_batch(["a", "b"]) == ["a", "b"]
    assert prompt_batch([[1], [2]]) == [[1], [2]]
    assert prompt_batch([]) == [[]]


def test_the_gateway_view_passes_unknown_fields_and_wants_one_prompt() -> None:
    body = CompletionBody.model_validate({"prompt": ["only"], "temperature": 0.2, "top_k": 3})
    assert body.single_prompt() == "only"
    for bad in ({"prompt": ["a", "b"]}, {"prompt": ""}, {"prompt": "x", "n": 2}):
        with pytest.raises(ValidationError):
            CompletionBody.model_validate(bad)
    with pytest.raises(ValidationError):
        ChatBody.model_validate({"messages": []})


def test_the_engine_view_logs_and_ignores_unknown_fields(caplog: pytest.LogCaptureFixture) -> None:
    """As vLLM (issue 20 item 4): an unknown field is served, with a warning naming it."""
    assert CompletionRequest.model_validate({"prompt": "x"}).max_tokens == 16
    with caplog.at_level("WARNING"):
        body = CompletionRequest.model_validate({"prompt": "x", "nonsense": 1})
    assert body.prompt == "x" and "ignored: ['nonsense']" in caplog.text
    with pytest.raises(ValidationError):  # a known field of the wrong type is still a 400
        CompletionRequest.model_validate({"prompt": "x", "max_tokens": "many"})


def test_answers_and_errors_have_vllms_shape() -> None:
    assert usage(3, 4) == {"prompt_tokens": 3, "total_tokens": 7, "completion_tokens": 4}
    choice = whole_choice(True, 0, "hi", "length")
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"] == "hi"
    answer = whole_answer(True, "chatcmpl-1", 5, "m", [choice], 3, 4)
    assert answer["object"] == "chat.completion" and answer["usage"]["total_tokens"] == 7
    assert whole_choice(False, 1, "t", None)["text"] == "t"
    assert orjson.loads(error_body(429, "full")) == {
        "error": {"message": "full", "type": "RateLimitError", "param": None, "code": 429}
    }
    assert orjson.loads(error_body(400, "bad", "BadRequestError"))["error"]["type"] == (
        "BadRequestError"
    )
    assert orjson.loads(error_body(418, "?"))["error"]["type"] == "APIError"

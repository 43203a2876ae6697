"""Request bodies, answers and the error body of the OpenAI wire format."""

from __future__ import annotations

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from balanceroute.serving.openai.requests import (
    BodyView,
    ChatBody,
    CompletionBody,
    CompletionRequest,
    plain_view,
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


SCALARS = st.none() | st.booleans() | st.integers(-2, 3) | st.sampled_from(["", "x", "m"])
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3)
    | st.dictionaries(st.sampled_from(["include_usage", "continuous_usage_stats", "role",
                                       "content", "text", "other"]), inner, max_size=3),
    max_leaves=8,
)  # fmt: skip
FIELDS = ["prompt", "messages", "model", "stream", "stream_options", "n", "max_tokens",
          "max_completion_tokens", "temperature"]  # fmt: skip
PLAIN = {"prompt": st.sampled_from(["hello there", [1, 2, 3]]),
         "messages": st.just([{"role": "user", "content": "hi"}]), "stream": st.booleans(),
         "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()})}  # fmt: skip


@settings(max_examples=1000, deadline=None)
@given(plain=st.fixed_dictionaries(PLAIN), changed=st.dictionaries(st.sampled_from(FIELDS),
       VALUES | st.sampled_from([[], [[1]], ["a"], [{"role": "user", "content": ["a"]}],
                                 [{"content": "a"}]]),
       max_size=2), chat=st.booleans())  # fmt: skip
@example(plain={"stream": True}, changed={"prompt": []}, chat=False)
@example(plain={"prompt": "a", "stream": True}, changed={"n": 2}, chat=False)
@example(plain={"prompt": "a", "stream": True}, changed={"n": True}, chat=False)
@example(plain={"prompt": "a", "stream": False}, changed={"max_tokens": 0}, chat=False)
@example(plain={"prompt": "a", "stream": False}, changed={"stream_options": {}}, chat=False)
@example(plain={"prompt": "a", "stream": True}, changed={"stream_options": {
    "continuous_usage_stats": 1}}, chat=False)  # fmt: skip
@example(plain={"stream": True}, changed={"messages": [{"content": "a"}]}, chat=True)
@example(plain={"stream": True}, changed={"messages": [{"role": "user", "content": ["a"]}]},
         chat=True)  # fmt: skip
@example(plain={"stream": True, "messages": [{"role": "u"}]}, changed={
    "max_completion_tokens": 0}, chat=True)  # fmt: skip
def test_a_plain_body_is_read_as_the_model_reads_it(plain: dict, changed: dict, chat: bool) -> None:
    """A client's plain body with up to two fields changed to anything: the shortcut accepts
    only what the model accepts, and reads it the same; the plain bodies take it."""
    model, body = (ChatBody if chat else CompletionBody), {**plain, **changed}
    view = plain_view(body, chat)
    try:
        checked = BodyView.of(model.model_validate(body))
    except ValidationError:
        assert view is None
        return
    assert view is None or view == checked
    if not changed and plain["stream"]:
        assert view == checked


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

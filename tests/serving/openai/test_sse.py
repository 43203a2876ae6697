"""The SSE framing the gateway's relay and bench's client share."""

from __future__ import annotations

import orjson

from balanceroute.serving.openai.sse import (
    DONE,
    DONE_PAYLOAD,
    EventSplitter,
    data_payload,
    encode,
    token_text,
)


def test_events_split_wherever_the_bytes_are_cut() -> None:
    stream = encode({"a": 1}) + b": ping\n\n" + encode({"b": 2}) + DONE
    for cut in range(1, len(stream)):
        splitter = EventSplitter()
        events = splitter.feed(stream[:cut]) + splitter.feed(stream[cut:])
        assert [data_payload(e) for e in events] == [b'{"a":1}', None, b'{"b":2}', DONE_PAYLOAD]
        assert splitter.buf == b""


def test_a_token_is_text_or_chat_content_but_not_the_role_chunk() -> None:
    assert token_text({"text": " the"}) == " the"
    assert token_text({"text": None}) is None
    assert token_text({"delta": {"content": "x"}}) == "x"
    assert token_text({"delta": {"role": "assistant", "content": ""}}) is None
    assert token_text({"delta": {"content": ""}}) == ""
    assert token_text({"delta": {}}) is None
    assert orjson.loads(data_payload(encode({"choices": []})) or b"") == {"choices": []}

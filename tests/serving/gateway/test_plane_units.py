"""The Protocol data plane's stream handling without processes: whatever pieces the rank's
stream arrives in, the client gets every event whole and in order (the usage chunk only when
asked), the token count and finish reason are exact; the front's body check answers as vLLM."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.serving.gateway.decider import LiveRequest
from balanceroute.serving.gateway.plane.exchange import Exchange, request_head
from balanceroute.serving.gateway.plane.front import BadBody, check_body
from balanceroute.serving.gateway.plane.request import (
    BAD,
    FINISHED,
    MARKED,
    MARKERS,
    PLAIN,
    PlaneContext,
    classify,
    matters,
)
from balanceroute.serving.gateway.plane.wire import DeciderProxy
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.upstream import RankPool
from balanceroute.serving.openai.assemble import Assembler
from balanceroute.serving.openai.requests import CompletionBody

SETTINGS = GatewaySettings(ranks=["http://127.0.0.1:9/base"], slots=4)
TOKENS = 25


def rank_stream(chat: bool) -> tuple[bytes, bytes]:
    """A vLLM stream asked for ``include_usage`` (no usage in a token chunk), and its usage
    event."""
    out = b""
    for n in range(1, TOKENS + 1):
        reason = "length" if n == TOKENS else None
        if chat:
            choice = {"index": 0, "delta": {"content": f" w{n}"}, "finish_reason": reason}
        else:
            choice = {"index": 0, "text": f" w{n}", "finish_reason": reason}
        obj = {"id": "x", "created": 1, "model": "m", "choices": [choice]}
        out += b"data: " + orjson.dumps(obj) + b"\n\n"
    usage = {"prompt_tokens": 3, "completion_tokens": TOKENS, "total_tokens": TOKENS + 3}
    event = b"data: " + orjson.dumps({"id": "x", "model": "m", "choices": [], "usage": usage})
    return out + event + b"\n\n" + b"data: [DONE]\n\n", event + b"\n\n"


class Client:
    """Records what an exchange writes to its client."""

    def __init__(self) -> None:
        self.head: list | None = None
        self.chunks: list[bytes] = []
        self.ended = False
        self.whole: tuple[int, bytes] | None = None

    def start_stream(self, headers: list, first: bytes = b"") -> None:
        self.head = headers
        if first:
            self.chunks.append(first)

    def write_chunk(self, data: bytes) -> None:
        assert self.head is not None and not self.ended
        self.chunks.append(data)

    def end_stream(self, last: bytes = b"") -> None:
        assert self.head is not None and not self.ended
        if last:
            self.chunks.append(last)
        self.ended = True

    def respond(self, status: int, headers: list, body: bytes) -> None:
        self.whole = (status, body)


def relay(pieces: list[bytes], *, stream: bool, usage: bool, chat: bool
          ) -> tuple[Client, Exchange, str]:  # fmt: skip
    async def run() -> tuple[Client, Exchange, str]:
        loop = asyncio.get_running_loop()
        ctx = PlaneContext(SETTINGS, DeciderProxy("/nowhere", lambda: None), None)
        req = LiveRequest(request_id="r", path="/v1/completions", chat=chat, body={},
                          stream=stream, usage=usage, continuous=False, prompt_tokens=3,
                          prompt_key="k", arrival=0.0, arrival_epoch=0.0, position=-1,
                          admitted=loop.create_future())  # fmt: skip
        client = Client()
        ex = Exchange(ctx, RankPool(SETTINGS), client, req, 1)
        ex.rank = 0
        ex.result = loop.create_future()
        ex.st.whole = None if stream else Assembler(chat)  # as an attempt sets it up
        ex.head(200)
        for piece in pieces:
            ex.body(piece)
        return client, ex, ex.result.result() if ex.result.done() else "open"

    return asyncio.run(run())


def cut(data: bytes, sizes: list[int]) -> list[bytes]:
    out, i, k = [], 0, 0
    while i < len(data):
        size = sizes[k % len(sizes)]
        out.append(data[i : i + size])
        i, k = i + size, k + 1
    return out


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 500), min_size=1, max_size=40), usage=st.booleans(),
       chat=st.booleans())  # fmt: skip
def test_every_event_reaches_the_client_whole_at_any_cut(sizes, usage, chat):
    data, usage_event = rank_stream(chat)
    client, ex, outcome = relay(cut(data, sizes), stream=True, usage=usage, chat=chat)
    expected = data if usage else data.replace(usage_event, b"")
    assert outcome == FINISHED and client.ended
    assert b"".join(client.chunks) == expected
    assert ex.st.tokens == TOKENS and ex.st.finish_reason == "length"
    assert (b"x-request-id", b"r") in (client.head or [])


@settings(max_examples=20, deadline=None)
@given(sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20))
def test_a_whole_answer_is_assembled_at_any_cut(sizes):
    data, _ = rank_stream(False)
    client, _, outcome = relay(cut(data, sizes), stream=False, usage=False, chat=False)
    assert outcome == FINISHED and client.whole is not None
    status, body = client.whole
    answer = orjson.loads(body)
    assert status == 200 and answer["usage"]["completion_tokens"] == TOKENS
    assert answer["choices"][0]["text"] == "".join(f" w{n}" for n in range(1, TOKENS + 1))
    assert answer["choices"][0]["finish_reason"] == "length"


def test_an_error_event_after_the_first_token_ends_the_stream_with_one():
    data, _ = rank_stream(False)
    first = data[: data.index(b"\n\n") + 2]
    error = b'data: {"error": {"message": "boom"}}\n\n'
    client, _, outcome = relay([first, error], stream=True, usage=False, chat=False)
    assert outcome == FINISHED and client.ended
    body = b"".join(client.chunks)
    assert body.startswith(first) and b"boom" in body and body.endswith(b"data: [DONE]\n\n")
    # in the same piece as the first token, the client has seen nothing: a 502, as in one process
    client, _, outcome = relay([first + error], stream=True, usage=False, chat=False)
    assert outcome == FINISHED and client.whole is not None and client.whole[0] == 502


def test_the_body_check_answers_as_vllm():
    with pytest.raises(BadBody) as bad:
        check_body(b'{"prompt": 3}', CompletionBody)
    error = orjson.loads(bad.value.body)["error"]
    assert error["type"] == "BadRequestError" and error["param"].startswith("prompt")
    with pytest.raises(BadBody) as bad:
        check_body(b"[1]", CompletionBody)
    assert "JSON object" in orjson.loads(bad.value.body)["error"]["message"]
    data, checked = check_body(b'{"prompt": "hi", "stream": true}', CompletionBody)
    assert data["prompt"] == "hi" and checked.stream is True


def test_the_request_head():
    head = request_head(RankPool(SETTINGS), 0, "/v1/completions", {"x-request-id": "a"}, 12)
    assert head.startswith(b"POST /base/v1/completions HTTP/1.1\r\nhost: 127.0.0.1:9\r\n")
    assert head.endswith(b"x-request-id: a\r\ncontent-length: 12\r\n\r\n")


PIECES = [b'"finish_reason":null', b'"finish_reason":"stop"', b'"finish_reason": "length"',
          b'"usage":null', b'"usage":{"a":1}', b'"usage": {"a":1}', b"[DONE]", b'"error"',
          b'"text":" w"', b'": ', b"data: ", b"\n\n", b"{", b'"']  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(parts=st.lists(st.sampled_from(PIECES), max_size=12))
def test_the_quick_marker_search_finds_what_the_expression_finds(parts):
    events = b"".join(parts)
    assert matters(events) == (MARKERS.search(events) is not None)


EVENT = st.fixed_dictionaries(
    {"choices": st.lists(st.fixed_dictionaries({
        "index": st.just(0),
        "text": st.sampled_from([" w", "[DONE]", "error", 'say "hi"', ""]),
        "finish_reason": st.sampled_from([None, "stop", "length"])}), max_size=2)},
    optional={"usage": st.sampled_from([None, {"completion_tokens": 3}]),
              "error": st.just({"message": "boom"})},
)  # fmt: skip


def _marked(event: dict | None) -> bool:
    """Whether an event must be read (not relayed as it came): the end, a finish, usage, error."""
    if event is None:
        return True  # data: [DONE]
    return ("error" in event or event.get("usage") is not None
            or any(c["finish_reason"] is not None for c in event["choices"]))  # fmt: skip


@settings(max_examples=300, deadline=None)
@given(events=st.lists(st.one_of(EVENT, st.none()), min_size=1, max_size=4),
       bad=st.sampled_from([None, b"data: {\"cut\n\n", b"event: x\n\n"]))  # fmt: skip
def test_a_piece_is_relayed_as_it_came_only_when_nothing_in_it_is_news(events, bad):
    """``classify``: BAD exactly when an event is not JSON data (or a comment), and never PLAIN
    when an event carries the end, a finish, usage or an error (it may say MARKED more often:
    the slow path reads it right)."""
    piece = b"".join(b"data: [DONE]\n\n" if e is None else b"data: " + orjson.dumps(e) + b"\n\n"
                     for e in events) + (bad or b"")  # fmt: skip
    kind = classify(piece)
    assert (kind == BAD) == (bad is not None)
    if bad is None and any(_marked(e) for e in events):
        assert kind == MARKED
    if bad is None and len(events) == 1 and events[0] is not None and not _marked(events[0]):
        assert kind == (MARKED if b'"error"' in piece else PLAIN)


def test_a_rank_get_reuses_its_connection_retries_a_stale_one_and_times_out():
    """``RankPool.get`` on a real server: kept alive (one connection for two reads), a
    kept-alive connection the server closed is replaced, a silent server times out."""

    async def run() -> None:
        accepted: list[int] = []
        mode = {"close_after": False, "silent": False}

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(1)
            while await reader.readuntil(b"\r\n\r\n"):
                if mode["silent"]:
                    await asyncio.sleep(5)
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nsteps")
                await writer.drain()
                if mode["close_after"]:
                    writer.close()
                    return

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        pool = RankPool(GatewaySettings(ranks=[f"http://127.0.0.1:{port}"], slots=1))
        try:
            assert await pool.get(0, "/metrics") == (200, b"steps")
            mode["close_after"] = True
            assert await pool.get(0, "/metrics") == (200, b"steps")
            assert len(accepted) == 1  # the first connection served both
            await asyncio.sleep(0.05)  # the server closed it after answering
            assert await pool.get(0, "/health") == (200, b"steps")  # a fresh one, no error
            assert len(accepted) == 2
            mode["silent"], mode["close_after"] = True, False
            with pytest.raises(TimeoutError):
                await pool.get(0, "/health", timeout_s=0.2)
        finally:
            pool.close()
            server.close()
        with pytest.raises(OSError):
            await pool.get(0, "/health", timeout_s=1.0)  # nobody listens any more

    asyncio.run(run())


def test_taking_a_ranks_last_idle_connection_opens_a_spare():
    """With ``spares`` (the data plane's pool), a request that takes a rank's last idle
    connection, or finds none, leaves a new idle one for the next; without (the probes' pool)
    nothing is opened ahead; a closed pool opens nothing."""

    async def run() -> None:
        accepted: list[int] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            accepted.append(1)
            await reader.read()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        settings = GatewaySettings(ranks=[f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"],
                                   slots=1)  # fmt: skip
        plain, spares = RankPool(settings), RankPool(settings, spares=True)
        try:
            assert plain.idle_connection(0) is None
            await asyncio.sleep(0.1)
            assert not plain.idle.get(0) and accepted == []
            assert spares.idle_connection(0) is None  # none yet: one is opened for the next
            await asyncio.sleep(0.1)
            assert len(spares.idle[0]) == 1 and len(accepted) == 1
            first = spares.idle_connection(0)
            assert first is not None and not first.closed  # the spare, taken: another opens
            await asyncio.sleep(0.1)
            assert len(spares.idle[0]) == 1 and spares.idle[0][0] is not first
            assert len(accepted) == 2
            spares.close()
            assert spares.idle_connection(0) is None
            await asyncio.sleep(0.1)
            assert len(accepted) == 2 and not spares.opening
            first.close()
        finally:
            plain.close()
            server.close()

    asyncio.run(run())

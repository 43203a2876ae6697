"""The emulator's OpenAI-compatible API on a real process: streams, bodies, errors, disconnects."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from balanceroute.cli import main
from balanceroute.features.prompts import build_prompt, build_prompt_ids
from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """Two ranks of one slot at 10x real time (an iteration is about 4 ms); outputs that may stop
    early are geometric with mean 8."""
    out = tmp_path_factory.mktemp("emu") / "emulator.out"
    output = {"kind": "geometric", "mean": 8.0}
    server = Emulator(out, ranks=2, slots=1, time_scale=10.0, output=output)
    yield server
    server.stop()


def sse_events(text: str) -> list[str]:
    """The ``data:`` payloads of an SSE body, in order."""
    return [e[len("data: ") :] for e in text.split("\n\n") if e.startswith("data: ")]


def post(url: str, body: dict, **kw) -> httpx.Response:
    return httpx.post(url, json=body, timeout=30.0, **kw)


@pytest.mark.parametrize("usage", [True, False])
def test_streamed_completion_gets_exactly_max_tokens_and_one_done(emu: Emulator, usage: bool):
    body = {"prompt": build_prompt(37, "k1"), "max_tokens": 9, "ignore_eos": True, "stream": True}
    if usage:
        body["stream_options"] = {"include_usage": True}
    r = post(emu.urls[0] + "/v1/completions", body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = sse_events(r.text)
    assert events.count("[DONE]") == 1 and events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    tokens = [c for c in chunks if c["choices"]]
    assert len(tokens) == 9
    assert [c["choices"][0]["finish_reason"] for c in tokens] == [None] * 8 + ["length"]
    assert all(c["object"] == "text_completion" for c in chunks)
    if usage:
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"] == {
            "prompt_tokens": 37,
            "total_tokens": 46,
            "completion_tokens": 9,
        }
    else:
        assert len(chunks) == 9


def test_streamed_chat_and_token_id_prompts(emu: Emulator):
    body = {
        "messages": [{"role": "user", "content": [{"type": "text", "text": "a b c"}]}],
        "max_completion_tokens": 3,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = sse_events(post(emu.urls[1] + "/v1/chat/completions", body).text)
    chunks = [json.loads(e) for e in events[:-1]]
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    content = [c for c in chunks[1:] if c["choices"]]
    assert len(content) == 3 and content[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["prompt_tokens"] == 3
    ids = {"prompt": build_prompt_ids(21, "k2"), "max_tokens": 2, "ignore_eos": True}
    r = post(emu.urls[0] + "/v1/completions", ids)
    assert r.json()["usage"] == {"prompt_tokens": 21, "total_tokens": 23, "completion_tokens": 2,
                                 "prompt_tokens_details": None, "completion_tokens_details": None}  # fmt: skip


def test_non_streaming_and_drawn_output_lengths(emu: Emulator):
    r = post(
        emu.urls[0] + "/v1/chat/completions",
        {
            "messages": [{"role": "user", "content": "hi there"}],
            "max_tokens": 4,
            "ignore_eos": True,
        },
    )
    out = r.json()
    assert out["object"] == "chat.completion" and out["usage"]["completion_tokens"] == 4
    assert out["choices"][0]["message"]["role"] == "assistant"
    reasons = set()
    for _ in range(8):  # without ignore_eos: a seeded draw capped by max_tokens
        got = post(emu.urls[1] + "/v1/completions", {"prompt": "x y", "max_tokens": 6}).json()
        n = got["usage"]["completion_tokens"]
        assert 1 <= n <= 6
        reasons.add(got["choices"][0]["finish_reason"])
        assert got["choices"][0]["finish_reason"] == ("length" if n == 6 else "stop")
    assert "stop" in reasons


BAD_BODIES = [
    ({"prompt": "a", "max_tokens": -3}, 400),
    ({"prompt": "a", "max_tokens": 0}, 400),
    ({"prompt": "a", "max_tokens": "ten"}, 400),
    ({"prompt": 42}, 400),
    ({"max_tokens": 3}, 400),
    ({"prompt": ""}, 400),
    ({"prompt": ["a", "b"]}, 400),
    ({"prompt": [1, -2]}, 400),
    ({"prompt": "a", "n": 2}, 400),
    ({"prompt": "a", "logprobs": 1}, 400),
    ({"prompt": "a", "max_tokens": 200_000}, 400),
    ({"prompt": "a", "model": "nope"}, 404),
    ([1, 2, 3], 400),
    # refused by vLLM 0.32 although each field is well typed (the emulator once answered 200)
    ({"prompt": "a", "max_tokens": 2, "min_tokens": 5}, 400),
    ({"prompt": "a", "stream": False, "stream_options": {"include_usage": True}}, 400),
]
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
BAD_CHATS = [  # each refused by vLLM 0.32 with a 400
    {"tools": [TOOL], "tool_choice": "auto"},  # no tool parser
    {"tools": [TOOL], "tool_choice": "banana"},
    {"tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}},
    {"tool_choice": "required"},  # no tools
    {"max_completion_tokens": 2, "min_tokens": 3},
]


def test_bad_input_gets_4xx_and_the_emulator_keeps_serving(emu: Emulator):
    url = emu.urls[0]
    for body, status in BAD_BODIES:
        r = httpx.post(url + "/v1/completions", json=body, timeout=10.0)
        assert r.status_code == status, (body, r.text)
        assert r.json()["error"]["code"] == status
    raw = [b"{not json", b"", b'{"prompt": "a",}', "\u00e9".encode("latin-1")]
    for content in raw:
        r = httpx.post(
            url + "/v1/completions",
            content=content,
            headers={"content-type": "application/json"},
            timeout=10.0,
        )
        assert r.status_code == 400, (content, r.text)
    r = httpx.post(url + "/v1/chat/completions", json={"messages": []}, timeout=10.0)
    assert r.status_code == 400
    r = httpx.post(url + "/v1/chat/completions", json={"messages": "hi"}, timeout=10.0)
    assert r.status_code == 400
    hi = [{"role": "user", "content": "hi"}]
    for extra in BAD_CHATS:
        r = httpx.post(url + "/v1/chat/completions", json={"messages": hi, **extra}, timeout=10.0)
        assert r.status_code == 400 and r.json()["error"]["code"] == 400, (extra, r.text)
    named = {"type": "function", "function": {"name": "f"}}
    r = post(url + "/v1/chat/completions", {"messages": hi, "tools": [TOOL], "tool_choice": named,
                                            "max_tokens": 2})  # fmt: skip
    assert r.status_code == 200
    assert httpx.get(url + "/health").status_code == 200
    ok = post(url + "/v1/completions", {"prompt": "a b", "max_tokens": 2, "ignore_eos": True})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


def test_client_disconnect_frees_the_slot(emu: Emulator):
    url = emu.urls[1]  # one slot
    before = metric_total(
        parse_metrics(httpx.get(url + "/metrics").text),
        "vllm:request_success_total",
        finished_reason="abort",
    )
    long_body = {"prompt": "a", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(1) as pool, httpx.Client(timeout=30.0) as client:
        with client.stream("POST", url + "/v1/completions", json=long_body) as stream:
            lines = stream.iter_lines()
            got = sum(
                1 for _, line in zip(range(6), lines, strict=False) if line.startswith("data")
            )
            assert got >= 3
            waiter = pool.submit(
                post, url + "/v1/completions", {"prompt": "b", "max_tokens": 3, "ignore_eos": True}
            )
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                samples = parse_metrics(httpx.get(url + "/metrics").text)
                if metric_total(samples, "vllm:num_requests_waiting") == 1:
                    break
                time.sleep(0.01)
            else:
                pytest.fail("the second request never queued behind the first")
            assert not waiter.done()
        # leaving the block closes the connection: the slot frees at the next iteration
        t0 = time.monotonic()
        second = waiter.result(timeout=10)
        assert time.monotonic() - t0 < 5
    assert second.status_code == 200 and second.json()["usage"]["completion_tokens"] == 3
    samples = parse_metrics(httpx.get(url + "/metrics").text)
    assert (
        metric_total(samples, "vllm:request_success_total", finished_reason="abort") == before + 1
    )
    assert metric_total(samples, "vllm:num_requests_running") == 0


def test_models_health_and_metrics(emu: Emulator):
    models = httpx.get(emu.urls[0] + "/v1/models").json()
    assert models["data"][0]["id"] == models["data"][0]["root"] == emu.config.model
    text = httpx.get(emu.urls[0] + "/metrics").text
    for name in (
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:generation_tokens_total",
        "vllm:prompt_tokens_total",
        'vllm:time_per_output_token_seconds_bucket{model_name="balanceroute-emulator",engine="0",le="0.01"}',
    ):
        assert name in text
    samples = parse_metrics(text)
    tpot_count = metric_total(samples, "vllm:time_per_output_token_seconds_count")
    gen = metric_total(samples, "vllm:generation_tokens_total")
    first = metric_total(samples, "vllm:time_to_first_token_seconds_count")
    assert tpot_count == gen - first  # one observation per token after each request's first


def test_cli_errors_are_one_line(tmp_path: Path, capsys):
    def run(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as exc:  # argparse refuses the flag itself
            return int(exc.code or 0)

    assert run(["emulate", "--ranks", "0"]) == 2
    assert run(["emulate", "--time-scale", "-1"]) == 2
    assert run(["emulate", "--slots", "1000000000"]) == 2  # once started, allocating G x B
    assert run(["emulate", "--model", ""]) == 2
    used = tmp_path / "log" / "iterations"
    used.mkdir(parents=True)
    (used / "part-00000.parquet").write_bytes(b"")
    assert run(["emulate", "--log", str(tmp_path / "log")]) == 2
    assert run(["bench", "--url", "ftp://x", "--out", str(tmp_path), "--requests", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 6 and all(line.startswith("balanceroute ") for line in err)

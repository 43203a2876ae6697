"""Issue 18, live: the gateway answers as a vLLM client expects (vLLM's error body and statuses,
every field of a non-streaming answer, ``x-request-id`` both ways) and keeps its completion log
clean (``finish_reason`` recorded, aborted streams left out, an abort before the first token
re-routed). Real processes on 127.0.0.1: the emulator, a small fake vLLM rank, the gateway."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import orjson
import pandas as pd
import pytest

from balanceroute.serving.testbed.bench.client import RequestRecord, stream_request
from tests.poll import until
from tests.serving.gateway.fake_ranks import FakeRank
from tests.serving.gateway.helpers import GatewayProcess
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server
ERROR_KEYS = {"message", "type", "param", "code"}
TOKEN = "answers-test-token-0123456789"


def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of vLLM's error body (AssertionError otherwise)."""
    err = resp.json().get("error")
    assert isinstance(err, dict) and set(err) >= ERROR_KEYS, resp.text[:300]
    assert err["message"] and err["code"] == resp.status_code, resp.text[:300]
    return err


@pytest.fixture(scope="module")
def emu_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcess]:
    base = tmp_path_factory.mktemp("answers")
    emu = Emulator(base / "emu.out", ranks=1, slots=2, time_scale=20.0)
    gw = None
    try:
        gw = GatewayProcess(base / "gw.out", emu.urls, "--slots", "2", "--router", "count-jsq",
                            env={"BALANCEROUTE_API_TOKEN": TOKEN,
                                 "BALANCEROUTE_MAX_BODY_BYTES": "2048"})  # fmt: skip
        yield gw
    finally:
        if gw is not None:
            gw.stop()
        emu.stop()


AUTH = {"authorization": f"Bearer {TOKEN}"}
BAD = [  # (body, headers, status, words the message names)
    (b"{not json", {"content-type": "application/json"}, 400, "JSON"),
    ({"prompt": "a", "max_tokens": "many"}, {}, 400, "max_tokens"),
    ({"prompt": "a", "max_tokens": -3}, {}, 400, "max_tokens"),
    ({"max_tokens": 3}, {}, 400, "prompt"),
    ({"prompt": "a", "n": 2}, {}, 400, "one sequence a request"),
    ({"prompt": ["a", "b"]}, {}, 400, "a batch of 2 prompts"),
    ({"prompt": "a", "stream": False, "stream_options": {"include_usage": True}}, {}, 400,
     "stream=True"),
    (b'{"prompt": "a"}', {"content-type": "text/plain"}, 400, "JSON"),
    ({"prompt": "a"}, {"host": "evil.example"}, 400, "Host"),
    ({"prompt": "a"}, {"origin": "http://evil.example"}, 403, "Origin"),
    ({"prompt": "word " * 600}, {}, 413, ""),
]  # fmt: skip


def test_every_gateway_error_has_vllms_body(emu_gateway: GatewayProcess) -> None:
    """Validation (400, not 422), guards, 413 and auth: vLLM's ``{"error": {...}}`` body."""
    url = emu_gateway.url + "/v1/completions"
    for body, headers, status, words in BAD:
        kw: dict[str, Any] = {"content": body} if isinstance(body, bytes) else {"json": body}
        r = httpx.post(url, headers={**AUTH, **headers}, timeout=30, **kw)
        assert r.status_code == status, (body, r.text[:300])
        err = error_of(r)
        assert words in err["message"], (body, err)
        if status == 400:
            assert err["type"] == "BadRequestError"
    r = httpx.post(url, json={"prompt": "a"}, timeout=30)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    assert error_of(r)["message"] == "missing or invalid bearer token"
    assert emu_gateway.get("/readyz").json() == {"status": "ready"}  # bare without the token
    assert "detail" in emu_gateway.get("/readyz", headers=AUTH).json()


def test_log_lines_carry_timestamps(emu_gateway: GatewayProcess) -> None:
    """Every line the gateway logs starts with its date and time (its own and uvicorn's)."""
    lines = [ln for ln in emu_gateway.log().splitlines() if "INFO" in ln or "WARNING" in ln]
    assert lines and all(re.match(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", ln) for ln in lines)


def test_openai_client_gets_bad_request_with_a_message(emu_gateway: GatewayProcess) -> None:
    """The official client raises BadRequestError (not UnprocessableEntityError) with a message."""
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=emu_gateway.url + "/v1", api_key=TOKEN, max_retries=0,
                           timeout=30.0)  # fmt: skip
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt="hi", max_tokens=-3)
    # the client reads the body's code as a string, as it does from vLLM itself
    assert caught.value.status_code == 400 and caught.value.code == "400"
    assert "max_tokens" in caught.value.message


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeRank]:
    rank = FakeRank(tmp_path / "fake.out")
    try:
        yield rank
    finally:
        rank.stop()


def _whole(url: str, prompt: str, rid: str, **extra: Any) -> httpx.Response:
    body = {"prompt": prompt, "max_tokens": 4, "stream": False, **extra}
    return httpx.post(url + "/v1/completions", json=body, headers={"x-request-id": rid},
                      timeout=30)  # fmt: skip


def _stream(url: str, prompt: str, max_tokens: int = 4) -> list[dict[str, Any]]:
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True}
    r = httpx.post(url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]"), r.text[-300:]
    return [orjson.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: {")]


def test_answers_keep_the_ranks_fields_and_the_log_stays_clean(fake: FakeRank,
                                                               tmp_path: Path) -> None:  # fmt: skip
    """Non-streaming answers keep every field; an abort before the first token is re-routed and
    logged once whole; an abort after it reaches the client but not the completion log."""
    gw = GatewayProcess(tmp_path / "gw.out", [fake.url], "--slots", "2", "--router", "count-jsq",
                        "--out", str(tmp_path / "gw"))  # fmt: skip
    try:
        r = _whole(gw.url, "hello", "rid-whole", logprobs=1)
        assert r.status_code == 200 and r.headers["x-request-id"] == "rid-whole", r.text[:300]
        answer = r.json()
        assert answer["id"] == "cmpl-rid-whole" and answer["system_fingerprint"] == "fp-fake"
        [choice] = answer["choices"]
        assert choice["text"] == " t" * 4 and choice["finish_reason"] == "length"
        assert choice["token_ids"] == [1, 2, 3, 4] and "stop_reason" in choice
        assert choice["logprobs"]["tokens"] == [" t"] * 4
        assert choice["logprobs"]["token_logprobs"] == [-0.5] * 4
        assert answer["usage"]["completion_tokens"] == 4

        events = _stream(gw.url, "abort-before please")  # the rank aborts it before a token
        assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
        assert sum(1 for e in events if e["choices"][0]["text"]) == 4
        events = _stream(gw.url, "empty-before please")  # [DONE] with nothing before it
        assert [e["choices"][0]["finish_reason"] for e in events][-1] == "length"
        assert sum(1 for e in events if e["choices"][0]["text"]) == 4
        events = _stream(gw.url, "abort-mid please", max_tokens=10)  # cut after two tokens
        assert events[-1]["choices"][0]["finish_reason"] == "abort"
        assert gw.metric("balanceroute_gateway_requests_total", outcome="aborted") == 1
        assert gw.metric("balanceroute_gateway_reroutes_total", rank="0") == 2
    finally:
        gw.stop()
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("*.parquet"))
    assert len(log) == 3  # the whole answer and the re-routed streams; not the aborted one
    assert list(log["finish_reason"]) == ["length"] * 3
    assert list(log["output_tokens"]) == [4, 4, 4]


def test_bench_counts_an_aborted_stream_as_failed(fake: FakeRank) -> None:
    """A stream the rank ended with ``abort`` is not a completed request for ``bench``."""

    async def one(prompt: str) -> RequestRecord:
        rec = RequestRecord(0)
        body = orjson.dumps({"prompt": prompt, "max_tokens": 6, "stream": True})
        async with aiohttp.ClientSession() as session:
            await stream_request(session, fake.url + "/v1/completions", body,
                                 {"content-type": "application/json"}, rec, 0.0, 30.0)  # fmt: skip
        return rec

    whole, cut = asyncio.run(one("fine")), asyncio.run(one("abort-mid"))
    assert whole.success and whole.finish_reason == "length" and whole.n_tokens == 6
    assert not cut.success and "abort" in cut.error and cut.n_tokens == 2


def test_deadlines_reroute_before_the_first_token_and_end_the_stream_after(
    fake: FakeRank, tmp_path: Path
) -> None:
    """A rank silent before the first token: re-routed after --first-token-timeout; silent
    after it: an SSE error event naming --chunk-timeout, then ``[DONE]``."""
    gw = GatewayProcess(tmp_path / "gw.out", [fake.url], "--slots", "2", "--router", "count-jsq",
                        "--first-token-timeout", "2s", "--chunk-timeout", "2s")  # fmt: skip
    try:
        events = _stream(gw.url, "hang-before please")
        assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert sum(1 for e in events if e["choices"][0]["text"]) == 4
        assert gw.metric("balanceroute_gateway_reroutes_total", rank="0") == 1
        events = _stream(gw.url, "hang-mid please", max_tokens=10)
        assert sum(1 for e in events if e.get("choices")) == 2
        assert "--chunk-timeout" in events[-1]["error"]["message"]
        assert gw.metric("balanceroute_gateway_requests_total", outcome="broken") == 1
        assert "first-token-timeout" in gw.log()
    finally:
        gw.stop()


def test_a_rank_refusing_the_key_leaves_the_rotation_and_none_left_is_503(tmp_path: Path) -> None:
    """A rank answering 401 (the gateway's key is wrong) is out, named so, and attracts nothing;
    with no rank in rotation a request gets a 503 with Retry-After at once."""
    locked = FakeRank(tmp_path / "locked.out", "--key", "right-key")
    good = FakeRank(tmp_path / "good.out")
    gw = None
    try:
        gw = GatewayProcess(tmp_path / "gw.out", [locked.url, good.url], "--slots", "2",
                            "--router", "count-jsq",
                            env={"BALANCEROUTE_UPSTREAM_API_KEY": "wrong-key"})  # fmt: skip
        for i in range(6):
            events = _stream(gw.url, f"hello {i}")
            assert events[-1]["choices"][0]["finish_reason"] == "length"
        assert gw.metric("balanceroute_gateway_rank_healthy", rank="0") == 0
        assert gw.metric("balanceroute_gateway_reroutes_total", rank="0") == 1  # once only
        assert "credentials" in gw.get("/readyz").json()["detail"]
        good.stop()
        deadline = time.monotonic() + 20
        while gw.get("/readyz").status_code != 503:
            assert time.monotonic() < deadline, gw.get("/readyz").text
            time.sleep(0.1)
        r = httpx.post(gw.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 503 and r.headers["retry-after"] == "1"
        assert "credentials" in error_of(r)["message"]
    finally:
        if gw is not None:
            gw.stop()
        locked.stop()
        good.stop()


def test_health_checks_have_hysteresis(fake: FakeRank, tmp_path: Path) -> None:
    """A rank whose /health fails every other time stays in rotation; one failing every time
    leaves after --health-fall checks and comes back after --health-rise good ones."""
    gw = GatewayProcess(tmp_path / "gw.out", [fake.url], "--slots", "2", "--router", "count-jsq",
                        "--health-interval", "100ms", "--health-fall", "3",
                        "--health-rise", "2")  # fmt: skip
    healthy = lambda: gw.metric("balanceroute_gateway_rank_healthy", rank="0")  # noqa: E731
    try:
        httpx.post(fake.url + "/control", json={"health": "flaky"}, timeout=5)
        time.sleep(2.0)  # about 20 checks, half of them failed, never 3 in a row
        assert healthy() == 1 and "left the rotation" not in gw.log()
        httpx.post(fake.url + "/control", json={"health": "fail"}, timeout=5)
        until(lambda: healthy() == 0)
        assert "3 checks in a row" in gw.log()
        r = httpx.post(gw.url + "/v1/completions", json={"prompt": "x"}, timeout=10)
        assert r.status_code == 503 and "503" in error_of(r)["message"]
        httpx.post(fake.url + "/control", json={"health": "ok"}, timeout=5)
        until(lambda: healthy() == 1)
        assert _stream(gw.url, "back again")[-1]["choices"][0]["finish_reason"] == "length"
    finally:
        gw.stop()


def test_a_killed_gateway_loses_at_most_rotate_s_of_its_log(fake: FakeRank, tmp_path: Path) -> None:
    """SIGKILL loses only the rows younger than BALANCEROUTE_ROTATE_S (+ the 1 s writer tick)."""
    gw = GatewayProcess(tmp_path / "gw.out", [fake.url], "--slots", "2", "--router", "count-jsq",
                        "--out", str(tmp_path / "gw"), env={"BALANCEROUTE_ROTATE_S": "1"})  # fmt: skip
    folder = tmp_path / "gw" / "completions"
    try:
        for i in range(3):
            _stream(gw.url, f"kept {i}")
        until(lambda: sum(len(pd.read_parquet(p)) for p in folder.glob("*.parquet")) == 3, 10.0)
    finally:
        gw.kill()


def test_sigterm_drains_streams_and_ends_the_rest_with_done(fake: FakeRank, tmp_path: Path) -> None:
    """SIGTERM: a short stream in flight finishes; a long one is ended at the drain deadline with
    an SSE error event and ``[DONE]``; no traceback in the log."""

    async def scenario() -> list[str]:
        async with httpx.AsyncClient(timeout=60.0) as client:

            async def one(prompt: str, n: int, begun: asyncio.Event) -> str:
                body = {"prompt": prompt, "max_tokens": n, "stream": True}
                lines = []
                async with client.stream("POST", gw.url + "/v1/completions", json=body) as r:
                    async for line in r.aiter_lines():
                        lines.append(line)
                        begun.set()
                return "\n".join(lines)

            begun = [asyncio.Event(), asyncio.Event()]
            tasks = [asyncio.create_task(one("short", 300, begun[0])),
                     asyncio.create_task(one("long", 5000, begun[1]))]  # fmt: skip
            await asyncio.wait_for(asyncio.gather(*(b.wait() for b in begun)), 30)
            gw.proc.send_signal(signal.SIGTERM)
            return await asyncio.wait_for(asyncio.gather(*tasks), 30)

    gw = GatewayProcess(tmp_path / "gw.out", [fake.url], "--slots", "2", "--router", "count-jsq",
                        "--drain-timeout", "3s")  # fmt: skip
    try:
        short, long = asyncio.run(scenario())
        assert gw.proc.wait(timeout=30) in (0, -signal.SIGTERM)
    finally:
        gw.stop()
    assert short.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in short
    assert "drain deadline" in long and long.rstrip().endswith("data: [DONE]"), long[-300:]
    assert "Traceback" not in gw.log() and "shutting down" in gw.log()

"""The data plane (the Protocol front in one process, the default, and in a relay worker,
``--relay-workers 1``) with real processes: the stream passed through byte for byte, the usage chunk stripped when not asked for,
re-routing before the first token, the error event after it, a client that leaves frees its
slot, the pass-through to the decider, the front's own answers (400, 401, 413, 408, 404)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pandas as pd
import pytest

from tests.serving.gateway import test_faults_live as faults
from tests.serving.gateway.fake_ranks import FakeRank
from tests.serving.gateway.helpers import GatewayProcess, token_events
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server


MODES = {"worker": ["--relay-workers", "1"], "inprocess": []}


class PlaneGateway(GatewayProcess):
    """``balanceroute gateway --relay-workers 1`` (or no flag: the same plane beside the
    decider, :data:`mode`)."""

    mode = "worker"

    def __init__(self, log: Path, ranks: list[str], *args: str, env: dict | None = None) -> None:
        super().__init__(log, ranks, *args, *MODES[self.mode], "--no-mlflow", env=env)


@pytest.fixture(params=sorted(MODES), autouse=True)
def mode(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test in a relay worker process and in one process."""
    monkeypatch.setattr(PlaneGateway, "mode", request.param)
    return request.param


@pytest.fixture
def two_fakes(tmp_path: Path) -> Iterator[list[FakeRank]]:
    ranks = [FakeRank(tmp_path / f"fake{i}.out") for i in range(2)]
    try:
        yield ranks
    finally:
        for r in ranks:
            r.stop()


def _post(url: str, body: dict, rid: str) -> bytes:
    r = httpx.post(url + "/v1/completions", json=body, headers={"x-request-id": rid}, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


def test_the_stream_passes_through_byte_for_byte(two_fakes, tmp_path):
    """The rank's events, cut at odd places and several in one piece, reach the client as the
    rank sent them (the usage chunk too when asked); without ``include_usage`` the same bytes
    less the usage chunk; the finish counts exactly the rank's tokens."""
    fake = two_fakes[0]
    gw = PlaneGateway(tmp_path / "gw.out", [fake.url], "--slots", "4", "--out",
                      str(tmp_path / "gw"))  # fmt: skip
    try:
        body = {"prompt": "plain", "max_tokens": 60, "stream": True,
                "stream_options": {"include_usage": True}}  # fmt: skip
        direct = _post(fake.url, body, "same")
        through = _post(gw.url, body, "same")
        assert through == direct
        assert b'"completion_tokens":60' in through and through.endswith(b"data: [DONE]\n\n")
        del body["stream_options"]
        bare = _post(gw.url, body, "same")
        usage_event = next(e for e in direct.split(b"\n\n") if b'"choices":[]' in e) + b"\n\n"
        assert b'"usage"' in usage_event and b'"usage"' not in bare
        assert bare == direct.replace(usage_event, b"")
        assert token_events(bare.decode()) == 60
        whole = httpx.post(gw.url + "/v1/completions", timeout=60,
                           json={"prompt": "plain", "max_tokens": 7}).json()  # fmt: skip
        assert whole["choices"][0]["text"] == "".join(f" w{n}" for n in range(1, 8))
        assert whole["usage"]["completion_tokens"] == 7
    finally:
        gw.stop()
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("*.parquet"))
    assert sorted(log["output_tokens"]) == [7, 60, 60]
    assert set(log["finish_reason"]) == {"length"}


def test_reroute_before_the_first_token_and_an_error_event_after(two_fakes, tmp_path):
    """An abort before the first token is re-routed (each fake rank aborts its first such
    request: two re-routes, then the client sees one whole stream); a rank
    silent after two tokens ends the stream with an SSE error naming --chunk-timeout, then
    ``[DONE]``."""
    gw = PlaneGateway(tmp_path / "gw.out", [f.url for f in two_fakes], "--slots", "4",
                      "--router", "count-jsq", "--chunk-timeout", "1s")  # fmt: skip
    try:
        body = {"prompt": "abort-before", "max_tokens": 12, "stream": True}
        text = _post(gw.url, body, "r1").decode()
        assert token_events(text) == 12 and text.endswith("data: [DONE]\n\n")
        assert sum(gw.metric("balanceroute_gateway_reroutes_total", rank=str(g))
                   for g in range(2)) == 2  # fmt: skip
        text = _post(gw.url, {"prompt": "hang-mid", "max_tokens": 10, "stream": True}, "r2").decode()
        assert token_events(text) == 2 and text.endswith("data: [DONE]\n\n")
        assert '"error"' in text and "--chunk-timeout" in text
        assert gw.metric("balanceroute_gateway_requests_total", outcome="broken") == 1
    finally:
        gw.stop()
    assert "Traceback" not in gw.log()


def test_a_client_that_leaves_frees_its_slot_and_the_ranks(tmp_path):
    """A client closing its connection mid-stream: the request leaves the decider's group and
    the rank stops generating it (the emulator's running count drops to zero)."""
    emu = Emulator(tmp_path / "emu.out", ranks=2, slots=4, time_scale=5.0)
    gw = PlaneGateway(tmp_path / "gw.out", emu.urls, "--slots", "4")

    def running() -> float:
        return sum(gw.metric("balanceroute_gateway_rank_running_requests", rank=str(g))
                   for g in range(2))  # fmt: skip

    try:
        body = {"prompt": "long", "max_tokens": 4000, "ignore_eos": True, "stream": True}
        with httpx.Client(timeout=60) as client:
            with client.stream("POST", gw.url + "/v1/completions", json=body) as r:
                lines = r.iter_lines()
                seen = [next(lines) for _ in range(6)]
                assert any(s.startswith("data: {") for s in seen)
                assert running() == 1
        for _ in range(100):  # polled: the cancellation is asynchronous
            if running() == 0 and emu.metrics("vllm:num_requests_running") == 0:
                break
            time.sleep(0.1)
        assert running() == 0
        assert emu.metrics("vllm:num_requests_running") == 0
        assert gw.metric("balanceroute_gateway_requests_total", outcome="cancelled") == 1
        short = {"prompt": "again", "max_tokens": 5, "ignore_eos": True, "stream": True}
        assert token_events(_post(gw.url, short, "after").decode()) == 5
    finally:
        gw.stop()
        emu.stop()


def test_the_fronts_own_answers_and_the_pass_through(two_fakes, tmp_path):
    """vLLM-shaped 400 and 401, a 413 for a big body, 404 and probes from the decider's app
    (a HEAD probe too), the Host check, and a request whose headers never end gets 408."""
    token = "t" * 24
    gw = PlaneGateway(tmp_path / "gw.out", [two_fakes[0].url], "--slots", "4",
                      "--header-timeout", "1s", env={"BALANCEROUTE_API_TOKEN": token,
                                                     "BALANCEROUTE_MAX_BODY_BYTES": "4096"})  # fmt: skip
    auth = {"authorization": f"Bearer {token}"}
    try:
        r = gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
        assert r.status_code == 401 and r.json()["error"]["code"] == 401
        r = gw.post("/v1/completions", json={"prompt": 3}, headers=auth)
        assert r.status_code == 400 and r.json()["error"]["type"] == "BadRequestError"
        assert "prompt" in r.json()["error"]["message"]
        r = gw.post("/v1/completions", content=b"{not json", headers=auth)
        assert r.status_code == 400 and "invalid JSON" in r.json()["error"]["message"]
        r = gw.post("/v1/completions", json={"prompt": "x" * 8000}, headers=auth)
        assert r.status_code == 413 and "BALANCEROUTE_MAX_BODY_BYTES" in r.text
        r = gw.post("/v1/completions", json={"prompt": "x"}, headers={**auth, "host": "evil.com"})
        assert r.status_code == 400 and "Host" in r.json()["error"]["message"]
        r = gw.post("/v1/completions", json={"prompt": "plain", "max_tokens": 3}, headers=auth)
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
        assert gw.get("/readyz").json()["status"] == "ready"
        probe = httpx.head(gw.url + "/health", timeout=10)  # a HEAD probe: GET's head, no body
        assert probe.status_code == 200 and probe.content == b""
        assert int(probe.headers["content-length"]) == len(gw.get("/health").content)
        assert gw.get("/nowhere", headers=auth).status_code == 404
        assert "balanceroute_gateway_requests_total" in gw.get("/metrics", headers=auth).text
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as s:
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nhost: 127.0.0.1\r\n")
            answer = s.recv(4096)
        assert answer.startswith(b"HTTP/1.1 408")
    finally:
        gw.stop()
    assert "Traceback" not in gw.log()


def test_queued_requests_get_503_after_the_no_rank_wait(tmp_path, monkeypatch):
    """The one-process scenario against the plane: every rank gone with requests queued behind
    one slot, each gets 503 naming --no-rank-wait once the outage lasted it (the decider must
    answer them: it once left them waiting for ever)."""
    monkeypatch.setattr(faults, "GatewayProcess", PlaneGateway)
    emu = Emulator(tmp_path / "emu.out", ranks=1, slots=1, time_scale=5.0)
    try:
        faults.test_queued_requests_get_503_after_the_no_rank_wait([emu], tmp_path)
    finally:
        emu.stop()


def _raw(port: int, request: bytes) -> tuple[bytes, dict[bytes, bytes], bytes]:
    """One request on a fresh socket, read until the gateway closes it (a read that waits 20 s
    fails the test: a connection kept open): the status line, the headers, the body."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as s:
        s.sendall(request)
        got = b""
        while chunk := s.recv(65536):
            got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    status, *lines = head.split(b"\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (x.partition(b":") for x in lines)}
    return status, headers, body


def _http10(path: str, token: str, body: bytes | None = None, extra: bytes = b"") -> bytes:
    """An HTTP/1.0 request as a 1.0 client writes it (``extra``: more header lines)."""
    method = b"POST" if body is not None else b"GET"
    lines = [method + b" " + path.encode() + b" HTTP/1.0", b"Host: 127.0.0.1",
             b"Authorization: Bearer " + token.encode()]  # fmt: skip
    if body is not None:
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
    return b"\r\n".join(lines) + b"\r\n" + extra + b"\r\n" + (body or b"")


def test_http10_clients_get_answers_they_can_read(two_fakes, tmp_path):
    """An HTTP/1.0 client (a raw socket) as uvicorn's h11 answers it: a stream without chunked
    framing, ended by the close (the rank's events byte for byte); whole answers, errors (400,
    401, 413) and passed-through paths with ``content-length``; the connection closed after each
    answer even when the request asked ``Connection: keep-alive``. A 1.1 request with
    ``Connection: close`` keeps the chunked framing and is closed after it. In one process the
    shutdown is logged once (the front and the decider share one drain; it was logged twice)."""
    token = "t" * 24
    fake = two_fakes[0]
    gw = PlaneGateway(tmp_path / "gw.out", [fake.url], "--slots", "4",
                      env={"BALANCEROUTE_API_TOKEN": token,
                           "BALANCEROUTE_MAX_BODY_BYTES": "4096"})  # fmt: skip
    stream = orjson.dumps({"prompt": "plain", "max_tokens": 9, "stream": True})
    try:
        direct = _post(fake.url, orjson.loads(stream), "same")
        for extra in (b"", b"Connection: keep-alive\r\n"):
            status, headers, body = _raw(gw.port, _http10("/v1/completions", token, stream,
                                                          b"X-Request-Id: same\r\n" + extra))  # fmt: skip
            assert status == b"HTTP/1.1 200 OK"
            assert b"transfer-encoding" not in headers and b"content-length" not in headers
            assert headers[b"connection"] == b"close"
            assert headers[b"content-type"].startswith(b"text/event-stream")
            assert body == direct and token_events(body.decode()) == 9
        whole = orjson.dumps({"prompt": "plain", "max_tokens": 4})
        status, headers, body = _raw(gw.port, _http10("/v1/completions", token, whole,
                                                      b"Connection: keep-alive\r\n"))  # fmt: skip
        assert status == b"HTTP/1.1 200 OK" and int(headers[b"content-length"]) == len(body)
        assert headers[b"connection"] == b"close"
        assert orjson.loads(body)["usage"]["completion_tokens"] == 4
        for request, code in [(_http10("/v1/completions", token, b"{not json"), 400),
                              (_http10("/v1/completions", "wrong" * 5, whole), 401),
                              (_http10("/v1/completions", token, b"x" * 8000), 413)]:  # fmt: skip
            status, headers, body = _raw(gw.port, request)
            assert status.startswith(b"HTTP/1.1 %d" % code)
            assert int(headers[b"content-length"]) == len(body)
            assert orjson.loads(body)["error"]["code"] == code
        passed = [("/health", b""), ("/metrics", b"balanceroute_gateway_requests_total")]
        for path, needle in passed:
            status, headers, body = _raw(gw.port, _http10(path, token))
            assert status == b"HTTP/1.1 200 OK" and int(headers[b"content-length"]) == len(body)
            assert needle in body
        status, headers, body = _raw(gw.port, _http10("/v1/completions", token, stream,
                                                      b"Connection: close\r\n")
                                     .replace(b"HTTP/1.0", b"HTTP/1.1", 1))  # fmt: skip
        assert headers[b"transfer-encoding"] == b"chunked" and headers[b"connection"] == b"close"
        assert body.endswith(b"0\r\n\r\n") and b"data: [DONE]" in body
    finally:
        gw.stop()
    assert "Traceback" not in gw.log()
    assert gw.log().count("shutting down: the streams in flight") == 1  # one gateway, one line

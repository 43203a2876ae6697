"""The gateway against hostile clients (issue 31's findings, live on 127.0.0.1): fields a client
controls cannot break a relay worker's line to the decider, and a request head over the limit
gets 431 at once, with bounded memory, in every layout."""

from __future__ import annotations

import contextlib
import re
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pandas as pd
import psutil
import pytest

from balanceroute.features.prompts import KEY_WORD_CHARS
from balanceroute.serving.gateway.plane.wire import ADMIT, FINISH, encode
from balanceroute.serving.http.deadline import HEAD_LIMIT
from balanceroute.serving.testbed.emulator.metrics import metric_total, parse_metrics
from tests.poll import until
from tests.serving.gateway.fake_ranks import FakeRank
from tests.serving.gateway.helpers import GatewayProcess, big_head, push_heads, token_events
from tests.serving.testbed.helpers import Emulator

REQUESTS = "balanceroute_gateway_requests_total"
STAMPED = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")  # every log line starts with its time


def unstamped(log: str) -> list[str]:
    """The log's lines without a time stamp (a print, a warning from a library)."""
    return [line for line in log.splitlines() if line.strip() and not STAMPED.match(line)]


pytestmark = pytest.mark.server


def _stream(url: str, n: int, out: list[int], headers: dict[str, str]) -> None:
    body = {"prompt": "long one", "max_tokens": n, "ignore_eos": True, "stream": True}
    r = httpx.post(url + "/v1/completions", json=body, headers=headers, timeout=120)
    out.append(token_events(r.text) if r.status_code == 200 else -r.status_code)


def _secrets_and_events_stay_private(gw: GatewayProcess, secrets: dict[str, str]) -> None:
    """A relay worker's environment and command line hold neither secret (they come by pipe),
    and the decider's event socket hangs up on a process that is not its worker, before it
    reads an event (it once took forged ADMIT and FINISH lines into the completion log)."""
    worker = psutil.Process(gw.proc.pid).children()[0]
    seen = Path(f"/proc/{worker.pid}/environ").read_bytes() + b" ".join(
        a.encode() for a in worker.cmdline()
    )
    assert not any(v.encode() in seen for v in secrets.values())
    events = next(c.laddr for c in psutil.Process(gw.proc.pid).net_connections("unix")
                  if str(c.laddr).endswith("events.sock"))  # fmt: skip
    with socket.socket(socket.AF_UNIX) as s:
        s.settimeout(10)
        s.connect(events)
        forged = encode(ADMIT, 1, 10, 7, "forged", "forged-1", True)
        forged += encode(FINISH, 1, 0, 1.0, 5.0, 999_999, 10, "stop")
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # hung up already
            s.sendall(forged)
            assert s.recv(100) == b""  # hung up, nothing answered


def test_client_fields_cannot_break_a_relay_workers_line(tmp_path: Path) -> None:
    """With a relay worker: a 1.5 MiB one-word prompt is served (its key is bounded), a long
    X-Request-Id is refused 400 and a 1.1 MiB one 431, while 4 streams on the same worker run
    to their end: nothing is counted ``relay_lost`` and every answered request is logged."""
    emu = Emulator(tmp_path / "emu.out", ranks=2, slots=4, time_scale=20.0)
    secrets = {"BALANCEROUTE_API_TOKEN": "tok-" + "a" * 20,
               "BALANCEROUTE_UPSTREAM_API_KEY": "key-" + "b" * 20}  # fmt: skip
    gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", "4", "--router", "count-jsq",
                        "--relay-workers", "1", "--no-mlflow", "--out", str(tmp_path / "gw"),
                        env=secrets)  # fmt: skip
    auth = {"authorization": f"Bearer {secrets['BALANCEROUTE_API_TOKEN']}"}
    done: list[int] = []
    try:
        _secrets_and_events_stay_private(gw, secrets)
        streams = [
            threading.Thread(target=_stream, args=(gw.url, 150, done, auth)) for _ in range(4)
        ]
        for t in streams:
            t.start()
        word = "w" * (3 << 19)  # 1.5 MiB, one word
        big = {"prompt": word, "max_tokens": 5, "ignore_eos": True}
        r = gw.post("/v1/completions", json=big, headers={**auth, "x-request-id": "big-word"})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 5
        r = gw.post("/v1/completions", json={"prompt": "x", "max_tokens": 2},
                    headers={**auth, "x-request-id": "i" * 300})  # fmt: skip
        assert r.status_code == 400 and "X-Request-Id" in r.json()["error"]["message"]
        answer, _ = big_head(gw.port, 1_100_000)
        assert answer.startswith(b"HTTP/1.1 431"), answer[:200]
        for t in streams:
            t.join(120)
        assert done == [150] * 4
        text = gw.get("/metrics", headers=auth).text
        assert metric_total(parse_metrics(text), REQUESTS, outcome="relay_lost") == 0
        assert metric_total(parse_metrics(text), REQUESTS, outcome="completed") == 5
    finally:
        assert gw.stop() in (0, -signal.SIGTERM)
        emu.stop()
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("*.parquet"))
    assert len(log) == 5
    key = log.loc[log["request_id"] == "big-word", "prompt_key"].item()
    assert key == "w" * KEY_WORD_CHARS
    assert "Traceback" not in gw.log()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_head_over_the_limit_gets_431_at_once_with_bounded_memory(tmp_path: Path,
                                                                    workers: int) -> None:  # fmt: skip
    """A 1 MiB header gets 431 within 3 s; 8 connections pushing 16 MiB of header each leave
    the gateway's processes at most 50 MB larger (they once grew by 400-800 MB)."""
    emu = Emulator(tmp_path / "emu.out", ranks=1, slots=4, time_scale=20.0)
    extra = ["--relay-workers", str(workers)] if workers else []
    gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", "4", "--no-mlflow", *extra)
    try:
        answer, seconds = big_head(gw.port, 1 << 20)
        assert answer.startswith(b"HTTP/1.1 431") and b"%d" % HEAD_LIMIT in answer, answer[:200]
        assert seconds < 3.0
        pids = [gw.proc.pid, *(c.pid for c in psutil.Process(gw.proc.pid).children())]
        answers, grew = push_heads(gw.port, pids)
        assert len(answers) == 8 and all(a.startswith(b"HTTP/1.1 431") for a in answers)
        assert grew < 50e6, grew
        assert gw.get("/readyz").status_code == 200
    finally:
        gw.stop()
        emu.stop()
    assert "Traceback" not in gw.log()


def _wave(url: str, n: int, headers: dict[str, str]) -> list[str]:
    """``n`` concurrent streams of 12 tokens: each answer's text (or its status)."""
    out: list[str] = [""] * n

    def one(i: int) -> None:
        body = {"prompt": f"wave {i}", "max_tokens": 12, "ignore_eos": True, "stream": True}
        try:
            out[i] = httpx.post(url + "/v1/completions", json=body, headers=headers,
                                timeout=60).text  # fmt: skip
        except httpx.HTTPError as exc:
            out[i] = f"client error: {exc}"

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(90)
    return out


def test_ranks_that_break_streams_leave_the_rotation_and_teach_nothing(tmp_path: Path) -> None:
    """Beside a good rank, one rank resets every stream after 3 tokens and one sends a chunk
    that is not JSON after 2, both answering ``/health``: each is out of rotation after
    ``health_fall`` (3) broken streams, named in ``/readyz``; the garbage never reaches a
    client, and no broken stream becomes a completion-log row (they once took half the
    traffic, and garbage streams were logged ``length``). SGLang's endpoints take the token."""
    good = FakeRank(tmp_path / "good.out")
    reset = FakeRank(tmp_path / "reset.out", "--break", "reset")
    garbage = FakeRank(tmp_path / "garbage.out", "--break", "garbage")
    token = "t" * 24
    gw = GatewayProcess(tmp_path / "gw.out", [good.url, reset.url, garbage.url], "--slots", "4",
                        "--router", "count-jsq", "--health-interval", "60s", "--no-mlflow",
                        "--out", str(tmp_path / "gw"), env={"BALANCEROUTE_API_TOKEN": token})  # fmt: skip
    auth = {"authorization": f"Bearer {token}"}
    answers: list[str] = []
    try:
        for path in ("/get_load", "/get_server_info", "/server_info", "/get_model_info",
                     "/model_info"):  # fmt: skip
            assert gw.get(path).status_code == 401, path  # no upstream call for anyone
        assert gw.get("/get_load", headers=auth).json()[0]["dp_rank"] == 0
        assert gw.get("/get_model_info", headers=auth).json()["model_path"] == "fake"
        for _ in range(6):  # within the first ejection (10 s)
            answers += _wave(gw.url, 3, auth)
        detail = gw.get("/readyz", headers=auth).json()["detail"] or ""
        samples = parse_metrics(gw.get("/metrics", headers=auth).text)
        broken = metric_total(samples, REQUESTS, outcome="broken")
        completed = metric_total(samples, REQUESTS, outcome="completed")
    finally:
        gw.stop()
        for rank in (good, reset, garbage):
            rank.stop()
    assert "rank 1: 3 streams in a row broke" in detail and "rank 2: 3 streams" in detail, detail
    assert 6 <= broken <= 8 and completed == 18 - broken
    assert not any("not json" in a for a in answers)
    assert sum('"error"' in a for a in answers) == broken
    log = pd.concat(pd.read_parquet(p) for p in (tmp_path / "gw" / "completions").glob("*.parquet"))
    assert len(log) == completed and set(log["worker"]) == {0}
    assert "Traceback" not in gw.log()


@pytest.mark.parametrize("workers", [0, 1])
def test_sigterm_closes_the_port_at_once_and_leaves_no_sockets(tmp_path: Path,
                                                               workers: int) -> None:  # fmt: skip
    """SIGTERM with a stream in flight: a new connection is refused within a second in every
    layout (with relay workers it once hung for the whole drain), and the Unix sockets'
    folder (relay workers only: the one-process gateway opens none) is gone after the exit."""
    emu = Emulator(tmp_path / "emu.out", ranks=1, slots=4, time_scale=1.0)
    extra = ["--relay-workers", str(workers)] if workers else []
    gw = GatewayProcess(tmp_path / "gw.out", emu.urls, "--slots", "4", "--no-mlflow",
                        "--drain-timeout", "4s", *extra)  # fmt: skip
    done: list[int] = []
    try:
        unix = {str(c.laddr) for c in psutil.Process(gw.proc.pid).net_connections("unix")
                if "balanceroute-gateway-" in str(c.laddr)}  # fmt: skip
        assert len(unix) == (2 if workers else 0), unix
        stream = threading.Thread(target=_stream, args=(gw.url, 400, done, {}))
        stream.start()
        until(lambda: gw.metric("balanceroute_gateway_rank_running_requests") >= 1, timeout_s=30)
        gw.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        refused = None
        while refused is None and time.monotonic() - t0 < 5:
            try:
                with socket.create_connection(("127.0.0.1", gw.port), timeout=1) as s:
                    s.sendall(b"GET /health HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
                    if s.recv(100) == b"":
                        refused = time.monotonic() - t0
            except TimeoutError:  # queued by the kernel, never answered: what must not happen
                pass
            except OSError:  # refused or reset
                refused = time.monotonic() - t0
            time.sleep(0.05)
        assert refused is not None and refused < 1.0, refused
        assert gw.proc.wait(30) in (0, -signal.SIGTERM)
        stream.join(30)
    finally:
        gw.stop()
        emu.stop()
    assert not any(Path(p).parent.exists() for p in unix)
    whole = gw.process.log_path.read_text()  # all of it: log() keeps a tail that cuts a line
    assert "Traceback" not in whole and not unstamped(whole), unstamped(whole)

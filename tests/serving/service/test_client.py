"""``RemoteEstimator`` against stand-in servers: every failure falls back, nothing raises."""

from __future__ import annotations

import pickle
import socket
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import joblib
import numpy as np
import orjson
import pytest

from balanceroute.predict.base import CompletedBatch, CompletionEstimator, Prediction, RunningBatch
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.remote import RemoteEstimator
from tests.serving.service.helpers import free_port

H = 80


def batch(n: int = 5) -> RunningBatch:
    return RunningBatch(
        np.arange(100, 100 + n), np.arange(n), np.arange(n, dtype=np.uint64), time_s=9.0
    )


def good_answer(body: dict) -> dict:
    n = len(body["requests"])
    return {
        "model": {"arm": "a", "name": "m", "version": "7", "kind": "fake"},
        "horizon": body.get("horizon", H),
        "ids": list(range(n)),
        "p_finish": [0.25] * n,
        "c": [10.5] * n,
        "survival": None,
    }


class FakeService:
    """A tiny HTTP/1.1 server whose answer to each POST is computed by ``respond``."""

    def __init__(self, respond: Callable[[str, dict], tuple[int, bytes]]) -> None:
        self.calls: list[tuple[str, dict]] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = orjson.loads(self.rfile.read(int(self.headers["content-length"])))
                outer.calls.append((self.path, body | {"_auth": self.headers.get("authorization")}))
                status, content = respond(self.path, body)
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(content)))
                self.end_headers()
                self.wfile.write(content)

            def log_message(self, *args: object) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake() -> Iterator[Callable[..., FakeService]]:
    made: list[FakeService] = []

    def make(respond: Callable[[str, dict], tuple[int, bytes]]) -> FakeService:
        made.append(FakeService(respond))
        return made[-1]

    yield make
    for f in made:
        f.close()


def ok(path: str, body: dict) -> tuple[int, bytes]:
    if path == "/v1/observe":
        return 200, orjson.dumps({"observed": len(body["completions"]), "arms": ["a"]})
    return 200, orjson.dumps(good_answer(body))


def test_a_good_answer_is_used_and_names_the_remote_kind(fake) -> None:
    service = fake(ok)
    est = RemoteEstimator(service.url, fallback=None, timeout_s=2.0, token="sekrit")
    assert est.name == "remote"
    pred = est.predict(batch())
    assert np.array_equal(pred.p_finish, np.full(5, 0.25))
    assert np.array_equal(pred.c, np.full(5, 10.5))
    assert est.name == "remote:fake"
    path, body = service.calls[0]
    assert path == "/v1/predict" and body["_auth"] == "Bearer sekrit"
    assert body["horizon"] == H and body["time_s"] == 9.0
    assert body["requests"][3] == {"id": 3, "prompt_tokens": 103, "age": 3, "prompt_key": 3}
    stats = est.stats()
    assert stats["remote_calls"] == 1 and stats["remote_ok"] == 1
    assert stats["remote_fallbacks"] == 0 and stats["remote_errors_by_kind"] == {}
    assert stats["remote_model"]["kind"] == "fake"


def test_completions_are_sent_before_the_next_prediction(fake) -> None:
    service = fake(ok)
    seen: list[int] = []

    class Spy(NoPrediction):
        def observe(self, completions: CompletedBatch) -> None:
            seen.append(completions.size)

    est = RemoteEstimator(service.url, fallback=Spy().fit(), timeout_s=2.0)
    done = CompletedBatch(np.array([10, 20]), np.array([3, 4]), None, np.array([1.0, 2.0]))
    est.observe(done)
    est.observe(CompletedBatch(np.array([30]), np.array([5]), np.array([9], dtype=np.uint64)))
    assert seen == [2, 1] and service.calls == []  # the fallback learns now, the network waits
    est.predict(batch())
    assert [p for p, _ in service.calls] == ["/v1/observe", "/v1/predict"]
    rows = service.calls[0][1]["completions"]
    assert rows == [
        {"prompt_tokens": 10, "output_tokens": 3, "prompt_key": 0, "time_s": 1.0},
        {"prompt_tokens": 20, "output_tokens": 4, "prompt_key": 0, "time_s": 2.0},
        {"prompt_tokens": 30, "output_tokens": 5, "prompt_key": 9},
    ]
    assert est.stats()["remote_observed"] == 3


def test_the_observation_buffer_is_bounded(fake) -> None:
    est = RemoteEstimator("http://127.0.0.1:9", fallback=None, max_pending=10)
    for _ in range(7):
        est.observe(CompletedBatch(np.ones(3, np.int64), np.ones(3, np.int64)))
    stats = est.stats()
    assert stats["remote_observe_pending"] <= 10
    assert stats["remote_observe_dropped"] == 21 - stats["remote_observe_pending"]


def test_a_dead_service_falls_back_then_backs_off() -> None:
    est = RemoteEstimator(f"http://127.0.0.1:{free_port()}", fallback=None, timeout_s=0.5)
    pred = est.predict(batch())
    again = est.predict(batch())
    none = NoPrediction(horizon=H).fit().predict(batch())
    for p in (pred, again):
        assert np.array_equal(p.p_finish, none.p_finish) and np.array_equal(p.c, none.c)
    stats = est.stats()
    assert stats["remote_errors_by_kind"] == {"connect": 1}
    assert stats["remote_calls"] == 1 and stats["remote_skipped"] == 1
    assert stats["remote_fallbacks"] == 2
    deadline = time.monotonic() + 30
    while est.stats()["remote_calls"] < 2:  # once the back-off expires, it tries again
        assert time.monotonic() < deadline, est.stats()
        est.predict(batch())
        time.sleep(0.01)
    assert est.stats()["remote_calls"] == 2


def test_a_silent_service_times_out_within_the_budget() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    try:
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        local = FixedEstimator()
        est = RemoteEstimator(url, fallback=local, timeout_s=0.05)
        t0 = time.monotonic()
        pred = est.predict(batch())
        assert time.monotonic() - t0 < 5.0  # not stalled (router_latency.py measures the budget)
        assert np.array_equal(pred.c, local.predict(batch()).c)
        assert est.stats()["remote_errors_by_kind"] == {"timeout": 1}
    finally:
        listener.close()


class FixedEstimator(CompletionEstimator):
    """A local fallback with recognisable answers."""

    name = "fixed"

    def __init__(self) -> None:
        super().__init__(horizon=H)
        self.fitted_ = True

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        n = batch.size
        return Prediction(
            np.full(n, 0.5), np.full(n, 7.0), np.ones((n, H + 1)) if survival else None
        )


def _answer(change: dict) -> Callable[[str, dict], tuple[int, bytes]]:
    def respond(path: str, body: dict) -> tuple[int, bytes]:
        return 200, orjson.dumps(good_answer(body) | change)

    return respond


@pytest.mark.parametrize(
    ("respond", "kind"),
    [
        (lambda p, b: (500, b'{"detail": "boom"}'), "http_500"),
        (lambda p, b: (401, b'{"detail": "token"}'), "http_401"),
        (lambda p, b: (200, b"not json"), "malformed"),
        (lambda p, b: (200, b"[1, 2]"), "malformed"),
        (_answer({"c": [1.0]}), "malformed"),
        (_answer({"p_finish": [None] * 5}), "malformed"),
        (_answer({"p_finish": [1.5] * 5}), "malformed"),
        (_answer({"c": [-1.0] * 5}), "malformed"),
        (_answer({"survival": [[1.0, 0.5]] * 5}), "malformed"),
        (_answer({"horizon": 40}), "horizon"),
    ],
)
def test_bad_answers_fall_back_and_are_counted_by_kind(fake, respond, kind: str) -> None:
    service = fake(respond)
    local = FixedEstimator()
    est = RemoteEstimator(service.url, fallback=local, timeout_s=2.0)
    pred = est.predict(batch(), survival=True)
    want = local.predict(batch(), survival=True)
    assert np.array_equal(pred.c, want.c) and np.array_equal(pred.survival, want.survival)
    assert est.stats()["remote_errors_by_kind"] == {kind: 1}
    assert est.stats()["remote_fallbacks"] == 1


def test_an_empty_batch_needs_no_call(fake) -> None:
    service = fake(ok)
    est = RemoteEstimator(service.url, fallback=None)
    empty = RunningBatch(np.zeros(0, np.int64), np.zeros(0, np.int64))
    assert est.predict(empty).c.shape == (0,)
    assert service.calls == [] and est.stats()["remote_calls"] == 0


def test_horizon_follows_the_fallback_and_the_token_the_environment(monkeypatch) -> None:
    monkeypatch.setenv("BALANCEROUTE_API_TOKEN", "from-env")
    est = RemoteEstimator("http://127.0.0.1:9", fallback=NoPrediction(horizon=40).fit())
    assert est.horizon == 40 and est.token == "from-env"
    assert RemoteEstimator("http://127.0.0.1:9", fallback=None).horizon == H


def test_it_pickles_without_its_connection(fake) -> None:
    service = fake(ok)
    est = RemoteEstimator(service.url, fallback=FixedEstimator(), timeout_s=2.0, model="b")
    est.predict(batch())
    est.observe(CompletedBatch(np.ones(2, np.int64), np.ones(2, np.int64)))
    for copy in (pickle.loads(pickle.dumps(est)), joblib.load(_dump(est))):
        assert copy.url == est.url and copy.model == "b" and copy.timeout_s == 2.0
        assert copy.stats()["remote_calls"] == 0 and copy.stats()["remote_observe_pending"] == 0
        assert np.array_equal(copy.predict(batch()).c, np.full(5, 10.5))
        assert service.calls[-1][1]["model"] == "b"


def _dump(est: RemoteEstimator):
    import io

    buf = io.BytesIO()
    joblib.dump(est, buf)
    buf.seek(0)
    return buf

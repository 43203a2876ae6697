"""Every error the gateway makes has vLLM's status, body and openai-client exception."""

from __future__ import annotations

import httpx
import openai
import pytest

from tests.conformance.engine import Engine
from tests.conformance.processes import Gateway
from tests.conformance.shapes import client, error_of, raised
from tests.conformance.wire import body, held, metric
from tests.poll import until

BAD_BODIES = {
    "wrong-type": lambda m: {"model": m, "prompt": "hi", "max_tokens": "many"},
    "out-of-range": lambda m: {"model": m, "prompt": "hi", "max_tokens": -3},
    "missing-prompt": lambda m: {"model": m, "max_tokens": 4},
    "stream-options-without-stream": lambda m: {**body(m), "stream": False,
                                                "stream_options": {"include_usage": True}},
}  # fmt: skip
@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_validation_error_is_vllms(engine: Engine, gateway: Gateway, case: str) -> None:
    """The same bad request gets the same status and error type from the gateway as from vLLM."""
    payload = BAD_BODIES[case](engine.model)
    direct = httpx.post(engine.ranks[0] + "/v1/completions", json=payload, timeout=30)
    via = httpx.post(gateway.url + "/v1/completions", json=payload, timeout=30)
    want = error_of(direct)
    assert via.status_code == direct.status_code, via.text[:300]
    got = error_of(via)
    assert got["code"] == want["code"], (got, want)


def test_invalid_json_is_vllms(engine: Engine, gateway: Gateway) -> None:
    """A body that is not JSON gets vLLM's status and error type."""
    raw = {"content": b'{"prompt": "hi", ', "headers": {"content-type": "application/json"}}
    direct = httpx.post(engine.ranks[0] + "/v1/completions", timeout=30, **raw)
    via = httpx.post(gateway.url + "/v1/completions", timeout=30, **raw)
    want = error_of(direct)
    assert via.status_code == direct.status_code, via.text[:300]
    assert error_of(via)["code"] == want["code"]


def test_openai_client_raises_the_same(engine: Engine, gateway: Gateway) -> None:
    """The official client raises the same exception class, type and param, with a message."""

    def call(url: str) -> openai.APIStatusError:
        return raised(lambda: client(url).completions.create(
            model=engine.model, prompt="hi", max_tokens=-3))  # fmt: skip

    want, got = call(engine.ranks[0]), call(gateway.url)
    assert type(got) is type(want), (type(got).__name__, type(want).__name__, got.message)
    assert (got.status_code, got.type, got.code) == (want.status_code, want.type, want.code)
    assert isinstance(got.body, dict) and got.body.get("message"), got.message


def test_auth_error_is_vllms(engine: Engine, start_gateway) -> None:
    """Without the bearer token: 401 with vLLM's body, AuthenticationError from the client."""
    if engine.dp_url is None or engine.dp_api_key is None:
        pytest.skip("needs CONFORMANCE_DP_URL with CONFORMANCE_DP_API_KEY (a server with a key)")
    gw = start_gateway(engine.ranks, env={"BALANCEROUTE_API_TOKEN": "conformance-token-0123456789"})
    call = lambda url: raised(lambda: client(url, "wrong-key-0123456789").completions.create(  # noqa: E731
        model=engine.model, prompt="hi", max_tokens=2))  # fmt: skip
    want, got = call(engine.dp_url), call(gw.url)
    assert type(got) is type(want) is openai.AuthenticationError, (type(got), got.message)
    via = httpx.post(gw.url + "/v1/completions", json=body(engine.model), timeout=30)
    assert via.status_code == 401
    error_of(via)


GUARD_CASES = {
    "host": {"host": "evil.example"},
    "origin": {"origin": "http://evil.example"},
    "content-type": {"content-type": "text/plain"},
}
GUARD_STATUS = {"host": 400, "origin": 403}  # vLLM has no Host/Origin check: the gateway's own status
@pytest.mark.parametrize("case", list(GUARD_CASES))
def test_guard_error_has_vllms_body(engine: Engine, gateway: Gateway, case: str) -> None:
    """Host, Origin and Content-Type refusals carry vLLM's error body (and its status, where
    vLLM refuses the same request too)."""
    content = httpx.Request("POST", "http://x", json=body(engine.model)).content
    headers = {"content-type": "application/json", **GUARD_CASES[case]}
    via = httpx.post(gateway.url + "/v1/completions", content=content, headers=headers, timeout=30)
    status = GUARD_STATUS.get(case)
    if status is None:
        direct = httpx.post(engine.ranks[0] + "/v1/completions", content=content, headers=headers,
                            timeout=30)  # fmt: skip
        assert direct.status_code >= 400, "vLLM served it: the case proves nothing"
        status = direct.status_code
    assert via.status_code == status, via.text[:300]
    error_of(via)


def test_body_too_large_has_vllms_body(engine: Engine, start_gateway) -> None:
    """A body above BALANCEROUTE_MAX_BODY_BYTES: 413 with vLLM's error body."""
    gw = start_gateway(engine.ranks, env={"BALANCEROUTE_MAX_BODY_BYTES": "1024"})
    via = httpx.post(gw.url + "/v1/completions", json=body(engine.model, prompt="word " * 400),
                     timeout=30)  # fmt: skip
    assert via.status_code == 413, via.text[:300]
    error_of(via)


def test_full_pool_is_429_with_vllms_body(engine: Engine, start_gateway) -> None:
    """A full pool: 429 with Retry-After and vLLM's body; the client raises RateLimitError (the
    two long streams filling the one slot and the pool are held open until the check is done,
    and checked alive before it: a stream that ended would leave the pool with room)."""
    gw = start_gateway(engine.ranks[:1], "--max-pool", "1", "--slots", "1")
    long = body(engine.model, max_tokens=8000)
    with held(gw.url, long, 2) as running:
        _wait_pool(gw)
        alive = sum(not f.done() for f in running)
        assert alive == 2, f"only {alive} of the 2 streams filling the pool ran before the check"
        via = httpx.post(gw.url + "/v1/completions", json=body(engine.model), timeout=30)
        exc = raised(lambda: client(gw.url).completions.create(
            model=engine.model, prompt="hi", max_tokens=2))  # fmt: skip
        still = sum(not f.done() for f in running)
    assert still == 2, f"only {still} of the 2 streams filling the pool still ran"
    assert via.status_code == 429, via.text[:300]
    assert via.headers.get("retry-after"), dict(via.headers)
    error_of(via)
    assert isinstance(exc, openai.RateLimitError) and exc.body.get("message"), exc


def _wait_pool(gw: Gateway, timeout_s: float = 120.0) -> None:
    """Wait until the gateway's pool holds a request (the one rank's slot is taken)."""
    pool = lambda: metric(httpx.get(gw.url + "/metrics", timeout=5).text, "balanceroute_gateway_pool_size")  # noqa: E731
    until(lambda: pool() >= 1, timeout_s, "the pool filled", poll_s=0.1)

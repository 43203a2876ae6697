"""Issue 18, the emulator as vLLM answers: usage in every chunk with ``continuous_usage_stats``,
vLLM's error body for a body that is not UTF-8 or nests too deep, a bounded ``--time-scale``."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from balanceroute.features.errors import UserError
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from tests.serving.testbed.helpers import Emulator

pytestmark = pytest.mark.server


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    server = Emulator(tmp_path_factory.mktemp("emu") / "emu.out", ranks=1, slots=2,
                      time_scale=20.0)  # fmt: skip
    try:
        yield server
    finally:
        server.stop()


def _events(text: str) -> list[dict]:
    return [orjson.loads(ln[6:]) for ln in text.splitlines() if ln.startswith("data: {")]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
def test_continuous_usage_stats_puts_the_usage_in_every_chunk(emu: Emulator, path: str) -> None:
    body = {"max_tokens": 5, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True}}  # fmt: skip
    body |= (
        {"messages": [{"role": "user", "content": "hi"}]} if "chat" in path else {"prompt": "hi"}
    )
    r = httpx.post(emu.urls[0] + path, json=body, timeout=30)
    assert r.status_code == 200 and r.text.rstrip().endswith("data: [DONE]")
    events = _events(r.text)
    tokens = [e for e in events if e["choices"] and e["choices"][0].get("finish_reason") in
              (None, "length") and ("text" in e["choices"][0] or e["choices"][0]["delta"].get(
                  "content"))]  # fmt: skip
    assert [e["usage"]["completion_tokens"] for e in tokens] == [1, 2, 3, 4, 5]
    assert all("usage" in e for e in events)
    assert events[-1]["choices"] == [] and events[-1]["usage"]["completion_tokens"] == 5
    plain = httpx.post(emu.urls[0] + path, json={**body, "stream_options": {}}, timeout=30)
    assert not any("usage" in e for e in _events(plain.text))  # only when asked


@pytest.mark.parametrize(
    "content",
    [b'{"prompt": "\xff\xfe", "max_tokens": 2}', b'{"prompt": "a", "x": ' + b"[" * 100_000],
    ids=["invalid-utf8", "deep-json"],
)
def test_unreadable_bodies_get_vllms_400(emu: Emulator, content: bytes) -> None:
    r = httpx.post(emu.urls[0] + "/v1/completions", content=content,
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code == 400, r.text[:300]
    error = r.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400 and error["message"]


@pytest.mark.parametrize("scale", [1e-300, 0.0, 1e9])
def test_time_scale_is_bounded(scale: float) -> None:
    with pytest.raises(UserError, match="--time-scale"):
        EmulatorConfig.from_dict({"time_scale": scale})


def test_time_scale_within_bounds_is_accepted(tmp_path: Path) -> None:
    assert EmulatorConfig.from_dict({"time_scale": 1e3}).time_scale == 1e3


def test_unknown_fields_are_logged_and_ignored(emu: Emulator) -> None:
    """As vLLM: a field no one reads (top level or in stream_options) is served, and logged."""
    body = {"prompt": "a b", "max_tokens": 2, "ignore_eos": True, "surprise": True,
            "stream": True, "stream_options": {"include_usage": True, "x": 1}}  # fmt: skip
    r = httpx.post(emu.urls[0] + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 200 and _events(r.text)[-1]["usage"]["completion_tokens"] == 2
    assert "present in the request but ignored: ['surprise']" in emu.log()
    assert "ignored: ['x']" in emu.log()

"""The shared HTTP base's pieces that need no server: the Host/Origin check's parsing and the
settings' refusals."""

from __future__ import annotations

import pytest

from balanceroute.features.errors import UserError
from balanceroute.serving.http.origin_check import host_name, is_json
from balanceroute.serving.http.settings import ServiceSettings, is_loopback, load_settings


def test_host_names_lose_their_port_and_case() -> None:
    assert host_name("LocalHost:8080") == "localhost"
    assert host_name("[::1]:8080") == "::1"
    assert host_name("::1") == "::1"
    assert host_name("example.org") == "example.org"


def test_json_content_types() -> None:
    assert is_json("application/json; charset=utf-8")
    assert is_json("application/problem+json")
    assert not is_json("text/plain")


def test_loopback_and_unsafe_settings() -> None:
    assert is_loopback("localhost") and is_loopback("127.0.0.1") and is_loopback("::1")
    assert not is_loopback("0.0.0.0")
    with pytest.raises(UserError):
        load_settings({"api_token": "short"}, cls=ServiceSettings)

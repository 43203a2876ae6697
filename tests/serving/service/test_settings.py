"""Settings that refuse unsafe configurations, the ``serve`` command's errors, the OpenAPI doc."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from balanceroute.cli import main as balanceroute_main
from balanceroute.features.errors import UserError
from balanceroute.serving.lifecycle.sources import check_uri
from balanceroute.serving.service.app import create_app
from balanceroute.serving.service.settings import ServeSettings


def test_defaults_listen_on_loopback_without_a_token(monkeypatch) -> None:
    monkeypatch.delenv("BALANCEROUTE_API_TOKEN", raising=False)
    s = ServeSettings(model_uri="m.joblib")
    assert (s.host, s.port, s.token, s.max_requests) == ("127.0.0.1", 8080, None, 16_384)
    assert s.uris() == {"a": "m.joblib"}


def test_environment_variables_configure_it(monkeypatch) -> None:
    monkeypatch.setenv("BALANCEROUTE_MODEL_URI", "models:/m@champion")
    monkeypatch.setenv("BALANCEROUTE_MODEL_URI_B", "models:/m/3")
    monkeypatch.setenv("BALANCEROUTE_API_TOKEN", "x" * 16)
    s = ServeSettings()
    assert s.uris() == {"a": "models:/m@champion", "b": "models:/m/3"}
    assert s.token == "x" * 16 and "x" * 16 not in repr(s)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"api_token": "short"}, "at least 16 characters"),
        ({"host": "0.0.0.0"}, "without a bearer token"),
        ({"max_requests": 20_000}, "less than or equal to 16384"),
    ],
)
def test_unsafe_settings_are_refused(monkeypatch, kwargs: dict, message: str) -> None:
    monkeypatch.delenv("BALANCEROUTE_API_TOKEN", raising=False)
    with pytest.raises(ValidationError, match=message):
        ServeSettings(model_uri="m.joblib", **kwargs)


def test_open_listening_needs_an_explicit_opt_in(monkeypatch) -> None:
    monkeypatch.delenv("BALANCEROUTE_API_TOKEN", raising=False)
    assert ServeSettings(model_uri="m", host="0.0.0.0", allow_unauthenticated=True).token is None
    assert ServeSettings(model_uri="m", host="0.0.0.0", api_token="t" * 20).token == "t" * 20
    assert ServeSettings(model_uri="m", api_token="").token is None


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("models:/name", "unsupported model URI"),
        ("models:/name/latest", "unsupported model URI"),
        ("runs:/abc/model", "unsupported model URI"),
        ("s3://bucket/model.joblib", "unsupported model URI"),
        ("/nowhere/model.joblib", "does not exist"),
    ],
)
def test_model_uris_are_checked(uri: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        check_uri(uri)


def test_supported_uris_pass(tmp_path: Path) -> None:
    path = tmp_path / "m.joblib"
    path.write_bytes(b"x")
    for uri in ("models:/completion-predictor@champion", "models:/m/3", str(path)):
        assert check_uri(uri) == uri


def test_serve_reports_bad_configuration_in_one_line(monkeypatch, capsys) -> None:
    monkeypatch.delenv("BALANCEROUTE_MODEL_URI", raising=False)
    assert balanceroute_main(["serve", "--model-uri", "/nowhere/m.joblib"]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert balanceroute_main(["serve"]) == 2
    assert "model_uri" in capsys.readouterr().err


def test_the_openapi_document_describes_the_self_decoded_bodies() -> None:
    doc = create_app(ServeSettings(model_uri="m.joblib")).openapi()
    schemas = doc["components"]["schemas"]
    for name in (
        "PredictRequest",
        "RunningRequestIn",
        "ObserveRequest",
        "RouteRequest",
        "BalanceRouteOptions",
        "ReloadRequest",
        "PredictResponse",
        "RouteResponse",
    ):
        assert name in schemas
    body = doc["paths"]["/v1/predict"]["post"]["requestBody"]
    assert body["content"]["application/json"]["schema"] == {
        "$ref": "#/components/schemas/PredictRequest"
    }
    assert schemas["PredictRequest"]["properties"]["requests"]["maxItems"] == 16_384
    assert "exact" not in schemas["RouteRequest"]["properties"]["policy"]["enum"]
    assert doc["paths"]["/v1/predict"]["post"]["security"] == [{"HTTPBearer": []}]


def test_route_options_follow_the_router_configuration() -> None:
    import dataclasses

    from balanceroute.router.policies.balance_route import BalanceRouteConfig
    from balanceroute.serving.service.route_schemas import BalanceRouteOptions

    names = {f.name for f in dataclasses.fields(BalanceRouteConfig)}
    assert set(BalanceRouteOptions.model_fields) == names
    assert BalanceRouteOptions.model_validate({"beta": None}).overrides() == {"beta": None}
    assert BalanceRouteOptions.model_validate({}).overrides() == {}


def test_a_reload_names_its_model_slot_by_the_new_name_or_the_old_one() -> None:
    from pydantic import ValidationError

    from balanceroute.serving.service.schemas import ReloadRequest

    assert ReloadRequest(slot="b").target == "b"
    assert ReloadRequest(arm="b").target == "b"
    assert ReloadRequest(slot="a", arm="a").target == "a"
    assert ReloadRequest().target is None
    with pytest.raises(ValidationError, match="different slots"):
        ReloadRequest(slot="a", arm="b")

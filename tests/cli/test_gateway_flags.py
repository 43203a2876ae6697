"""The gateway's flags are generated from its settings: every setting is a flag (but the bearer
token, a secret) and a ``BALANCEROUTE_<NAME>`` environment variable, and both set it alike;
the old flag names still work and the removed ones name their replacement."""

from __future__ import annotations

import argparse
import json
import os

import pytest

from balanceroute.cli import build_parser
from balanceroute.cli.gateway import settings_from_args
from balanceroute.features.errors import UserError
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.http.settings import load_settings

BASE = ["gateway", "--rank", "http://127.0.0.1:9", "--slots", "2"]
ENV_ONLY = {"api_token"}
# a value for each setting that differs from its default (the text a user would type)
VALUES = {
    "host": "localhost", "allowed_hosts": "a.example", "allowed_origins": "http://a.example",
    "port": "8123", "max_body_bytes": "4096", "header_timeout_s": "3", "body_timeout_s": "4",
    "idle_timeout_s": "2", "log_level": "debug", "rank_header": "X-data-parallel-rank",
    "group_size": "2", "router": "count-jsq", "estimator": "survival",
    "estimator_url": "http://127.0.0.1:7", "estimator_timeout_s": "0.5", "history": "h.csv",
    "arms": "count-jsq,token-jsq", "switch_every_s": "60", "warmup_s": "5", "seed": "7",
    "get_load": "load", "tokenizer": "tok.json", "max_pool": "64", "tick_s": "0.005",
    "decide": "now", "sample_s": "0.5",
    "health_interval_s": "2", "health_fall": "5", "health_rise": "4", "connect_timeout_s": "3",
"first_token_timeout_s": "9", "chunk_timeout_s": "8",
    "drain_timeout_s": "7", "no_rank_wait_s": "6", "max_attempts": "2", "out": "outdir",
    "rotate_bytes": "2048", "rotate_s": "11", "relay_workers": "2", "twin_nice": "3",
    "slots": "3",
}  # fmt: skip
BOOLS = {"allow_unauthenticated", "access_log", "track", "twins"}
TOGETHER = {
    "rank_header": ["group_size"],
    "group_size": ["rank_header"],
}


def _parser() -> argparse.ArgumentParser:
    return build_parser(["gateway"])


def _actions() -> dict[str, argparse.Action]:
    sub = next(a for a in _parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {a.dest: a for a in sub.choices["gateway"]._actions}


def _set(name: str, via_env: bool, monkeypatch: pytest.MonkeyPatch) -> GatewaySettings:
    """Settings with ``name`` (and what it needs) given by flags or by the environment."""
    names = [name, *TOGETHER.get(name, [])]
    if via_env:
        for n in names:
            value = VALUES.get(n)
            if n in BOOLS:
                value = str(not GatewaySettings.model_fields[n].default).lower()
            monkeypatch.setenv(f"BALANCEROUTE_{n.upper()}", value)
        base = {"ranks": ["http://127.0.0.1:9"], "slots": 2}
        return load_settings({k: v for k, v in base.items() if k not in names}, cls=GatewaySettings)
    argv = BASE[:3] if name == "slots" else list(BASE)
    actions = _actions()
    for n in names:
        flags = actions[n].option_strings
        if n in BOOLS:
            on = not GatewaySettings.model_fields[n].default
            argv.append(next(f for f in flags if f.startswith("--no-") != on))
        else:
            argv += [flags[0], VALUES[n]]
    return settings_from_args(_parser().parse_args(argv))


def test_every_setting_is_a_flag_but_the_secret():
    actions = _actions()
    fields = set(GatewaySettings.model_fields)
    assert fields - ENV_ONLY <= set(actions), sorted(fields - ENV_ONLY - set(actions))
    assert not ENV_ONLY & set(actions)
    assert set(VALUES) | BOOLS | {"ranks"} >= fields - ENV_ONLY  # every setting is tried below


@pytest.mark.parametrize("name", sorted(set(GatewaySettings.model_fields) - ENV_ONLY - {"ranks"}))
def test_a_flag_and_its_environment_variable_set_the_setting_alike(name, monkeypatch):
    for key in list(os.environ):
        if key.startswith("BALANCEROUTE_"):
            monkeypatch.delenv(key)
    default = getattr(GatewaySettings(ranks=["http://127.0.0.1:9"], slots=2), name)
    by_flag = getattr(_set(name, False, monkeypatch), name)
    by_env = getattr(_set(name, True, monkeypatch), name)
    assert by_flag == by_env != default


def test_the_ranks_repeat_as_flags_and_are_a_list_in_the_environment(monkeypatch):
    urls = ["http://127.0.0.1:9", "http://127.0.0.1:10"]
    argv = ["gateway", "--rank", urls[0], "--rank", urls[1], "--slots", "2"]
    assert settings_from_args(_parser().parse_args(argv)).ranks == urls
    monkeypatch.setenv("BALANCEROUTE_RANKS", json.dumps(urls))
    assert load_settings({"slots": 2}, cls=GatewaySettings).ranks == urls
    monkeypatch.setenv("BALANCEROUTE_API_TOKEN", "t" * 24)
    assert load_settings({"slots": 2}, cls=GatewaySettings).token == "t" * 24


@pytest.mark.parametrize("argv, name, value", [
    (["--no-mlflow"], "track", False), (["--no-twins"], "twins", False),
    (["--tick", "5ms"], "tick_s", 0.005), (["--ranks", "2", "--rank-header", "X"], "group_size", 2),
    (["--predictor", "survival"], "estimator", "survival"),
    (["--predictor-url", "http://127.0.0.1:7"], "estimator_url", "http://127.0.0.1:7"),
])  # fmt: skip
def test_the_old_flag_names_still_work(argv, name, value, capsys):
    args = _parser().parse_args([*BASE, *argv])
    assert getattr(settings_from_args(args), name) == value


@pytest.mark.parametrize("flag, names", [
    ("--front", "--relay-workers"), ("--relay-plane", "--relay-workers"), ("--hold", "--decide"),
    ("--hold-quiet", "--decide"), ("--hold-step", "--decide"),
])  # fmt: skip
def test_removed_flags_name_their_replacement(flag, names, capsys):
    with pytest.raises(SystemExit) as stop:
        _parser().parse_args([*BASE, flag, "protocol"])
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert f"{flag} was removed" in err and names in err


@pytest.mark.parametrize("argv, says", [
    (["--arms", "brh,,"], "empty spec"), (["--arms", ","], "empty spec"),
])  # fmt: skip
def test_options_that_mean_nothing_are_refused(argv, says):
    """An empty arm spec, once started without a word."""
    args = _parser().parse_args([*BASE, *argv])
    with pytest.raises(UserError, match=says):
        settings_from_args(args)

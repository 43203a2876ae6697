"""``balanceroute gateway``: BalanceRoute live in front of the data-parallel ranks of one group.

Its flags are generated from :class:`~balanceroute.serving.gateway.settings.GatewaySettings`
(:func:`~balanceroute.cli.options.settings_flags`): each setting is a flag and a
``BALANCEROUTE_<NAME>`` environment variable, declared once, in the settings.
"""

from __future__ import annotations

import argparse
from typing import Any

from balanceroute.cli.options import add_alias, add_flags, given_settings, settings_flags
from balanceroute.serving.gateway.launch import run
from balanceroute.serving.gateway.runtime import build_gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.http.settings import load_settings

REMOVED = {  # flag: what replaces it
    "--front": "the gateway always runs its Protocol front; use --relay-workers N for relay "
    "worker processes",
    "--relay-plane": "relay workers always run the Protocol data plane; use --relay-workers N",
    "--hold": "decisions wait for the group's next step by default (--decide step); --decide now "
    "decides at once",
    "--hold-quiet": "decisions wait for the group's next step by default (--decide step)",
    "--hold-step": "the step-timed decision is the default (--decide step), its margin from the "
    "measured lags",
}
DESCRIPTION = (
    "Serve POST /v1/completions and /v1/chat/completions (streaming or not) and GET /v1/models "
    "in front of the data-parallel ranks of one decode group: requests wait in the gateway's "
    "pool and the router admits them, at most --slots in flight per rank. Also /healthz, "
    "/readyz, /health (vLLM's probe, for a front router), /get_load, /get_server_info, "
    "/get_model_info (SGLang's, for a load-aware front router), /metrics, POST /admin/reload, "
    "GET /v1/ab. Every flag can be set as BALANCEROUTE_<NAME> (the setting's name: --tick is "
    "BALANCEROUTE_TICK_S); BALANCEROUTE_API_TOKEN requires a bearer token on every endpoint but "
    "the probes, BALANCEROUTE_UPSTREAM_API_KEY is sent to the ranks."
)


class Removed(argparse.Action):
    """A flag that was removed: an error naming what replaces it."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs="?", help=argparse.SUPPRESS)

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        parser.error(f"{option_string} was removed: {REMOVED[str(option_string)]}")


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``gateway`` subcommand, its flags generated from the settings."""
    p = sub.add_parser(
        "gateway",
        help="BalanceRoute live: an OpenAI-compatible gateway in front of the decode ranks",
        description=DESCRIPTION,
    )
    add_flags(p.add_argument_group("settings"), settings_flags(GatewaySettings))
    add_alias(p, "--predictor", "--estimator", "estimator")
    add_alias(p, "--predictor-url", "--estimator-url", "estimator_url")
    for flag in REMOVED:
        p.add_argument(flag, action=Removed)
    p.set_defaults(func=cmd_gateway)


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """The settings the flags (over ``BALANCEROUTE_*``) describe; bad ones are UserErrors."""
    return load_settings(given_settings(args, GatewaySettings), cls=GatewaySettings)


def cmd_gateway(args: argparse.Namespace) -> int:
    """Check everything and load every model first (errors exit 2), then serve until stopped."""
    settings = settings_from_args(args)
    gateway = build_gateway(settings)
    run(settings, gateway)  # its first log line says where it listens, the group and the arms
    return 0

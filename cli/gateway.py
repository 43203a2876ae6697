"""``balanceroute gateway``: BalanceRoute live in front of the data-parallel ranks of one group."""

from __future__ import annotations

import argparse
import re

from balanceroute.cli.options import add_alias, positive_float, positive_int
from balanceroute.serving.gateway.launch import run
from balanceroute.serving.gateway.runtime import build_gateway
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.http.settings import load_settings

_DURATION = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h)?\s*$")
_UNIT = {"ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def duration(text: str) -> float:
    """argparse type: a duration such as ``30s``, ``2m``, ``500ms`` or ``45`` (seconds), > 0."""
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"expected a duration such as 30s or 2m, got {text!r}")
    value = float(match.group(1)) * _UNIT[match.group(2)]
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be longer than 0, got {text}")
    return value


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``gateway`` subcommand."""
    p = sub.add_parser(
        "gateway",
        help="BalanceRoute live: an OpenAI-compatible gateway in front of the decode ranks",
        description="Serve POST /v1/completions and /v1/chat/completions (streaming or not) and "
        "GET /v1/models in front of the data-parallel ranks of one decode group: requests wait "
        "in the gateway's pool and the router admits them, at most --slots in flight per rank. "
        "Also /healthz, /readyz, /health (vLLM's probe, for a front router), /get_load, /get_server_info, /get_model_info (SGLang's, for a load-aware front router), /metrics, POST /admin/reload, GET /v1/ab. Every flag can be "
        "set as BALANCEROUTE_<FLAG>; BALANCEROUTE_API_TOKEN requires a bearer token on every "
        "endpoint but the probes, BALANCEROUTE_UPSTREAM_API_KEY is sent to the ranks.",
    )
    g = p.add_argument_group("the decode group")
    g.add_argument(
        "--rank",
        action="append",
        dest="ranks",
        metavar="URL",
        help="base URL of one rank, in rank order (repeat per rank); with --rank-header, the "
        "one upstream URL",
    )
    g.add_argument("--slots", type=positive_int, help="B: requests in flight per rank at most")
    g.add_argument(
        "--rank-header",
        help="header mode: send every request to the one --rank URL, the chosen rank in this "
        "header (vLLM: X-data-parallel-rank)",
    )
    g.add_argument("--ranks", dest="group_size", type=positive_int, help="header mode: G")
    r = p.add_argument_group("routing")
    r.add_argument("--router", help="router spec, as in simulate (default brh)")
    r.add_argument(
        "--estimator",
        metavar="KIND[@MODEL_URI]",
        help="the router's estimator, e.g. gbdt@models:/completion-predictor@champion (default "
        "none; survival, exactmatch, gbdt without a URI need --history)",
    )
    add_alias(r, "--predictor", "--estimator", "estimator")
    r.add_argument("--estimator-url", help="a prediction service (balanceroute serve) to ask")
    add_alias(r, "--predictor-url", "--estimator-url", "estimator_url")
    r.add_argument(
        "--estimator-timeout",
        dest="estimator_timeout_s",
        type=positive_float,
        help="budget of one call to the service in seconds (0.01)",
    )
    r.add_argument("--history", metavar="TRACE", help="trace to fit estimators given no URI on")
    r.add_argument("--tokenizer", metavar="FILE", help="a tokenizer.json for exact prompt counts")
    r.add_argument("--max-pool", type=positive_int, help="waiting requests at most (4096)")
    r.add_argument("--tick", dest="tick_s", type=duration, help="decision tick (10ms)")
    r.add_argument("--hold", dest="hold_s", type=duration,
                   help="while the group is half full, decide arrivals and finishes together after "
                   "this long, not at once (off by default; below one engine step)")  # fmt: skip
    r.add_argument("--hold-quiet", dest="hold_quiet_s", type=duration,
                   help="with --hold: decide once nothing asked for a decision this long, the "
                   "hold at the latest (off by default: the whole hold)")  # fmt: skip
    r.add_argument("--hold-step", dest="hold_step_s", type=duration,
                   help="where a hold applies, decide this long before the group's next step "
                   "ends, from the tokens' arrival times (off by default; a few ms: the time "
                   "to hear a token plus the time to forward a request)")  # fmt: skip
    r.add_argument("--sample", dest="sample_s", type=duration,
                   help="the group's sample (metrics, A/B imbalance, ticks.parquet) while no "
                   "request waits (100ms; every tick while one does)")  # fmt: skip
    r.add_argument("--max-attempts", type=positive_int, help="ranks a request may try (3)")
    r.add_argument("--first-token-timeout", dest="first_token_timeout_s", type=duration,
                   help="first token deadline from forwarding; then re-routed (60s)")  # fmt: skip
    r.add_argument("--drain-timeout", dest="drain_timeout_s", type=duration,
                   help="on SIGTERM, time the streams in flight get to finish (30s)")  # fmt: skip
    r.add_argument("--no-rank-wait", dest="no_rank_wait_s", type=duration,
                   help="once no rank is in rotation, the queued requests' wait for one before "
                   "503 (10s)")  # fmt: skip
    r.add_argument("--chunk-timeout", dest="chunk_timeout_s", type=duration,
                   help="deadline between two chunks of a started stream; then ended (30s)")  # fmt: skip
    a = p.add_argument_group("switchback A/B")
    a.add_argument("--arms", help="comma-separated router specs alternated over time windows")
    a.add_argument("--switch-every", dest="switch_every_s", type=duration, help="window (30s)")
    a.add_argument("--warmup", dest="warmup_s", type=duration, help="left out of each window")
    a.add_argument("--seed", type=int, help="seed of the arm order (0)")
    a.add_argument("--no-twins", dest="twins", action="store_false", default=None,
                   help="no live twins nor counterfactual (twin-driven arms keep their start "
                   "weight)")  # fmt: skip
    a.add_argument("--twin-nice", type=int, metavar="N",
                   help="the live twins' process's OS priority, N steps below the gateway's (0)")  # fmt: skip
    a.add_argument(
        "--no-mlflow", dest="track", action="store_false", default=None, help="no MLflow runs"
    )
    s = p.add_argument_group("service")
    s.add_argument("--host", help="address to listen on (127.0.0.1)")
    s.add_argument("--port", type=int, help="TCP port (8000)")
    s.add_argument("--out", help="folder for completions/ (the completion log) and ab/")
    s.add_argument(
        "--health-interval", dest="health_interval_s", type=duration, help="health checks (1s)"
    )
    s.add_argument("--health-fall", type=positive_int,
                   help="failed health checks in a row that take a rank out (3)")  # fmt: skip
    s.add_argument("--health-rise", type=positive_int,
                   help="good health checks in a row that bring it back (2)")  # fmt: skip
    s.add_argument("--header-timeout", dest="header_timeout_s", type=duration,
                   help="a request's headers must arrive within this; else 408, closed (10s)")  # fmt: skip
    s.add_argument("--body-timeout", dest="body_timeout_s", type=duration,
                   help="its body within this after the headers; else closed (60s)")  # fmt: skip
    s.add_argument("--idle-timeout", dest="idle_timeout_s", type=duration,
                   help="a kept-alive connection idle this long is closed (5s)")  # fmt: skip
    s.add_argument("--get-load", choices=("sglang", "load"),
                   help="shape of GET /get_load for a front router: SGLang's list per rank "
                   "(sglang-router, the default) or {\"load\": n} (vllm-router)")  # fmt: skip
    s.add_argument("--log-level", help="log level (info)")
    s.add_argument(
        "--relay-workers", type=int, metavar="N",
        help="split the gateway: one decider process and N relay worker processes sharing the "
        "port, which move the bytes and report first tokens and finishes (0: one process, the "
        "default)",
    )  # fmt: skip
    p.set_defaults(func=cmd_gateway)


FLAGS = ("ranks", "slots", "rank_header", "group_size", "router", "estimator", "estimator_url",
         "estimator_timeout_s", "history", "tokenizer", "max_pool", "tick_s", "hold_s", "hold_quiet_s", "hold_step_s", "sample_s", "max_attempts",
         "first_token_timeout_s", "chunk_timeout_s", "drain_timeout_s", "no_rank_wait_s",
         "arms", "switch_every_s", "warmup_s", "seed", "track", "host", "port", "out",
         "health_interval_s", "health_fall", "health_rise", "header_timeout_s", "body_timeout_s",
         "idle_timeout_s", "log_level", "relay_workers", "get_load", "twins", "twin_nice")  # fmt: skip


def settings_from_args(args: argparse.Namespace) -> GatewaySettings:
    """The settings the flags (over ``BALANCEROUTE_*``) describe; bad ones are UserErrors."""
    return load_settings({k: getattr(args, k) for k in FLAGS}, cls=GatewaySettings)


def cmd_gateway(args: argparse.Namespace) -> int:
    """Check everything and load every model first (errors exit 2), then serve until stopped."""
    settings = settings_from_args(args)
    gateway = build_gateway(settings)
    arms = ", ".join(a.label for a in gateway.arms)
    print(
        f"gateway on http://{settings.host}:{settings.port} in front of {settings.group} ranks "
        f"x {settings.slots} slots; arms: {arms}",
        flush=True,
    )
    run(settings, gateway)
    return 0

"""``balanceroute emulate``: a synchronized decode group behind G OpenAI-compatible endpoints."""

from __future__ import annotations

import argparse

from balanceroute.cli.options import add_cost_arg, positive_float, positive_int
from balanceroute.router.lab.cost import resolve_cost
from balanceroute.serving.testbed.emulator.config import (
    DEFAULT_MODEL,
    GET_LOAD_SHAPES,
    OUTPUT_KINDS,
    EmulatorConfig,
    OutputLengths,
)
from balanceroute.serving.testbed.emulator.iterlog import IterationLog
from balanceroute.serving.testbed.emulator.runner import exec_emulator


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``emulate`` subcommand."""
    p = sub.add_parser(
        "emulate",
        help="emulate a decode group behind one OpenAI-compatible port per rank",
        description="Serve G ranks of B slots that decode in lockstep, each on its own port "
        "(port-base + rank): POST /v1/completions and /v1/chat/completions (streaming or "
        "not), GET /v1/models, /health and /metrics (vLLM metric names), and what the peer "
        "routers ask an engine for (SGLang's /get_load, /get_server_info, /get_model_info; "
        "vLLM's POST /v1/completions/render). Iteration k lasts "
        "t_fixed + max_g (t_token * L_g(k) + t_prefill * P_g(k)) (--cost; P_g: prompt tokens "
        "computed, with t_prefill > 0 in a fitted cost file) divided by the time scale. Stop "
        "with Ctrl-C or SIGTERM; --log DIR then holds the iteration and request logs.",
    )
    p.add_argument(
        "--ranks", type=positive_int, default=8, help="G: ranks, one port each (default 8)"
    )
    p.add_argument(
        "--slots", type=positive_int, default=32, help="B: running requests per rank (32)"
    )
    add_cost_arg(p)
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    p.add_argument("--port-base", type=int, default=9000, help="port of rank 0 (9000)")
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="run X times faster than the cost model (default 1: real time)",
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the output-length draws")
    p.add_argument("--log", dest="log_dir", help="write the iteration and request logs here")
    p.add_argument(
        "--rank-header",
        help="a request carrying this header (e.g. X-data-parallel-rank) runs on the rank it "
        "names, whatever port it reached (vLLM's one-server header mode)",
    )
    p.add_argument("--model", default=DEFAULT_MODEL, help="served model name (%(default)s)")
    p.add_argument(
        "--max-model-len", type=positive_int, default=131_072, help="prompt + output limit (131072)"
    )
    p.add_argument(
        "--kv-capacity",
        type=int,
        default=0,
        help="KV tokens a rank holds at kv_cache_usage_perc = 1 (default slots * 16384)",
    )
    p.add_argument(
        "--output-dist",
        default="geometric",
        choices=OUTPUT_KINDS,
        help="output length when ignore_eos is false, capped by max_tokens (geometric)",
    )
    p.add_argument(
        "--output-mean",
        type=positive_float,
        default=256.0,
        help="its mean (lognormal: median), 256",
    )
    p.add_argument(
        "--output-sigma", type=positive_float, default=1.0, help="lognormal log-spread (1.0)"
    )
    p.add_argument(
        "--get-load",
        default="sglang",
        choices=GET_LOAD_SHAPES,
        help="shape of GET /get_load: SGLang's list, read by sglang-router's power_of_two "
        "(default), or {\"load\": requests}, read by vllm-router's",
    )
    p.set_defaults(func=cmd_emulate)


def config_from_args(args: argparse.Namespace) -> EmulatorConfig:
    """The emulator configuration the flags describe (bad values raise UserError)."""
    return EmulatorConfig(
        ranks=args.ranks,
        slots=args.slots,
        cost_name=args.cost,
        cost=resolve_cost(args.cost),
        time_scale=args.time_scale,
        seed=args.seed,
        host=args.host,
        port_base=args.port_base,
        model=args.model,
        max_model_len=args.max_model_len,
        kv_capacity_tokens=args.kv_capacity,
        output=OutputLengths(args.output_dist, args.output_mean, args.output_sigma),
        log_dir=args.log_dir,
        rank_header=args.rank_header,
        get_load=args.get_load,
    )


def cmd_emulate(args: argparse.Namespace) -> int:
    """Check the flags here (errors exit 2), then exec the lean emulator process."""
    config = config_from_args(args)
    IterationLog(config.log_dir, config.ranks)  # a used log folder is a one-line error here
    exec_emulator(config)
    return 0  # pragma: no cover - exec does not return

"""``balanceroute bench``: replay a trace against any OpenAI-compatible endpoint."""

from __future__ import annotations

import argparse
import os
import sys

from balanceroute.cli.options import (
    add_cost_arg,
    add_workload_args,
    positive_float,
    positive_int,
    workload_from_args,
)
from balanceroute.router.lab.cost import resolve_cost
from balanceroute.serving.testbed.bench.plan import ENDPOINTS, PROMPT_FORMATS
from balanceroute.serving.testbed.bench.run import BenchConfig, run_bench


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``bench`` subcommand."""
    p = sub.add_parser(
        "bench",
        help="replay a trace against OpenAI-compatible endpoints (vLLM, SGLang, the emulator)",
        description="Send every trace request at its arrival time (scaled) with a prompt of its "
        "prompt length (the same prompt key gives the same prompt prefix), max_tokens = its "
        "output length, ignore_eos and streaming; several --url are served round-robin. "
        "Writes OUT/summary.json (vllm bench serve's key names) and OUT/requests.parquet.",
    )
    p.add_argument(
        "--url",
        action="append",
        required=True,
        dest="urls",
        metavar="URL",
        help="base URL of one rank (http://host:port) or a full endpoint URL; repeat for more",
    )
    add_workload_args(p)
    rate = p.add_mutually_exclusive_group()
    rate.add_argument(
        "--rate-scale", type=positive_float, help="arrivals X times faster (default 1)"
    )
    rate.add_argument(
        "--load",
        type=positive_float,
        help="arrivals at X times the estimated decode capacity of --ranks x --slots",
    )
    p.add_argument(
        "--ranks", type=positive_int, help="--load: decode ranks (default: number of --url)"
    )
    p.add_argument("--slots", type=positive_int, default=32, help="--load: slots per rank (32)")
    add_cost_arg(p, help_="--load: the cost model, a preset or a cost file (%(default)s)")
    p.add_argument(
        "--time-scale",
        type=positive_float,
        default=1.0,
        help="--load: the emulator's --time-scale (its capacity scales with it)",
    )
    p.add_argument(
        "--endpoint", default="completions", choices=list(ENDPOINTS), help="API (completions)"
    )
    p.add_argument(
        "--prompt-format",
        default="text",
        choices=PROMPT_FORMATS,
        help="text (whitespace words, the emulator's tokenizer) or ids (exact lengths anywhere)",
    )
    p.add_argument("--model", help="model name (default: the first one /v1/models lists)")
    p.add_argument("--api-key", help="bearer token (default: $OPENAI_API_KEY if set)")
    p.add_argument("--concurrency-limit", type=positive_int, help="at most C requests open at once")
    p.add_argument(
        "--request-timeout",
        type=positive_float,
        default=600.0,
        help="seconds a request may take (600)",
    )
    p.add_argument(
        "--max-duration",
        type=positive_float,
        help="bound on the whole run in seconds (default: last send + one request timeout)",
    )
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar (default: on a terminal only)",
    )
    p.set_defaults(func=cmd_bench)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark and print its headline figures."""
    resolve_cost(args.cost)  # a bad --cost is an error before anything is sent
    config = BenchConfig(
        urls=tuple(args.urls),
        out_dir=args.out,
        workload=workload_from_args(args),
        rate_scale=args.rate_scale,
        load=args.load,
        ranks=args.ranks,
        slots=args.slots,
        cost=args.cost,
        time_scale=args.time_scale,
        endpoint=args.endpoint,
        prompt_format=args.prompt_format,
        model=args.model,
        api_key=args.api_key or os.environ.get("OPENAI_API_KEY") or None,
        concurrency_limit=args.concurrency_limit,
        request_timeout_s=args.request_timeout,
        max_duration_s=args.max_duration,
        progress=args.progress,
    )
    result = run_bench(config)
    s = result.summary
    print(
        f"{s['completed']} completed, {s['failed']} failed in {s['duration']:.1f} s: "
        f"{s['request_throughput']:.2f} req/s, {s['output_throughput']:.1f} output tok/s; "
        f"TTFT median {s['median_ttft_ms']:.1f} ms p99 {s['p99_ttft_ms']:.1f} ms; "
        f"TPOT median {s['median_tpot_ms']:.1f} ms; ITL p99 {s['p99_itl_ms']:.1f} ms"
    )
    for error, count in s["errors"].items():
        print(f"  {count} x {error[:160]}")
    print(f"wrote {result.out_dir}/summary.json and requests.parquet")
    if s["completed"] == 0 and s["failed"] > 0:
        print("balanceroute bench: error: every request failed", file=sys.stderr)
        return 1
    return 0

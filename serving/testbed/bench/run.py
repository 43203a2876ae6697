"""``balanceroute bench``: replay a trace against OpenAI-compatible endpoints, then summarise.

One asyncio loop sends every planned request at its time (a concurrency limit may hold some
back; the wait is recorded as ``queue_s``), each with its own timeout; the whole run is bounded
(default: the last send time plus one request timeout), after which requests still open are
cancelled and counted as failed with their error. Nothing is half-written: ``summary.json`` and
``requests.parquet`` are written to temporary files and renamed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.files import write_bytes, write_parquet
from balanceroute.features.schema import to_arrays
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.router.lab.cost import resolve_cost
from balanceroute.router.lab.prefill import rate_scale_for_load
from balanceroute.serving.testbed.bench.client import RequestRecord, stream_request
from balanceroute.serving.testbed.bench.plan import Plan, make_plan, resolve_targets
from balanceroute.serving.testbed.bench.records import records_frame, summarize

CLIENT_KEEPALIVE_S = 2.0  # idle connections kept for reuse; below every server's idle timeout


@dataclass(frozen=True, slots=True)
class BenchConfig:
    """One benchmark run (see ``balanceroute bench --help`` for every field)."""

    urls: tuple[str, ...]
    out_dir: str
    workload: WorkloadSpec = field(default_factory=WorkloadSpec)
    rate_scale: float | None = None
    load: float | None = None
    ranks: int | None = None  # for --load: decode ranks (default: the number of URLs)
    slots: int = 32  # for --load
    cost: str = "paper-dsv3"  # for --load
    time_scale: float = 1.0  # for --load: the emulator's time scale (capacity x time_scale)
    endpoint: str = "completions"
    prompt_format: str = "text"
    model: str | None = None
    api_key: str | None = None
    concurrency_limit: int | None = None
    request_timeout_s: float = 600.0
    max_duration_s: float | None = None
    connect_timeout_s: float = 10.0
    progress: bool | None = None  # None: a bar on a terminal only
    extra_headers: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.rate_scale is not None and self.load is not None:
            raise UserError("give --rate-scale or --load, not both")
        if self.concurrency_limit is not None and self.concurrency_limit < 1:
            raise UserError(f"--concurrency-limit must be >= 1, got {self.concurrency_limit}")
        if not self.time_scale > 0:
            raise UserError(f"--time-scale must be > 0, got {self.time_scale}")
        if not self.request_timeout_s > 0:
            raise UserError("--request-timeout must be > 0")
        if self.max_duration_s is not None and not self.max_duration_s > 0:
            raise UserError("--max-duration must be > 0")


@dataclass(slots=True)
class BenchResult:
    """A finished run: its summary, per-request table and where they were written."""

    summary: dict[str, Any]
    requests: pd.DataFrame
    out_dir: Path


async def fetch_model(base_url: str, headers: dict[str, str], timeout_s: float) -> str | None:
    """The first model id a server lists at ``/v1/models`` (None if it cannot say)."""
    try:
        timeout = aiohttp.ClientTimeout(total=timeout_s)
        async with (
            aiohttp.ClientSession(timeout=timeout) as session,
            session.get(base_url + "/v1/models", headers=headers) as resp,
        ):
            if resp.status != 200:
                return None
            data = await resp.json(content_type=None)
            return str(data["data"][0]["id"])
    except (aiohttp.ClientError, TimeoutError, KeyError, IndexError, TypeError, ValueError):
        return None


def _progress(enabled: bool | None, total: int):
    from tqdm import tqdm

    return tqdm(
        total=total, unit="req", desc="bench", disable=None if enabled is None else not enabled
    )


async def run_plan(
    plan: Plan, config: BenchConfig, max_duration_s: float
) -> tuple[list[RequestRecord], float]:
    """Send every planned request; return the records and the run's duration (s)."""
    records = [RequestRecord(i) for i in range(plan.size)]
    headers = {"content-type": "application/json", **config.extra_headers}
    if config.api_key:
        headers["authorization"] = f"Bearer {config.api_key}"
    limit = config.concurrency_limit
    # a kept-alive connection is reused only well inside the server's idle timeout (5 s in vLLM,
    # uvicorn and the gateway): reusing one the server is closing gets a reset, not an answer
    connector = aiohttp.TCPConnector(
        limit=limit or 0, keepalive_timeout=CLIENT_KEEPALIVE_S, force_close=False
    )
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=config.connect_timeout_s)
    sem = asyncio.Semaphore(limit) if limit else None
    bar = _progress(config.progress, plan.size)
    tasks: list[asyncio.Task] = []
    loop = asyncio.get_running_loop()
    t0 = time.perf_counter()
    last_end = t0

    async def one(i: int) -> None:
        nonlocal last_end
        rec = records[i]
        target = plan.targets[int(plan.target[i])]
        h = {**headers, "x-request-id": plan.request_id(i)}
        body = plan.body(i)
        try:
            if sem is not None:
                q0 = time.perf_counter()
                async with sem:
                    rec.queue_s = time.perf_counter() - q0
                    await stream_request(
                        session, target.url, body, h, rec, t0, config.request_timeout_s
                    )
            else:
                await stream_request(
                    session, target.url, body, h, rec, t0, config.request_timeout_s
                )
        except asyncio.CancelledError:
            if not rec.error:
                rec.error = "cancelled: the run's time limit was reached before it was sent"
            raise
        finally:
            last_end = max(last_end, time.perf_counter())
            bar.update(1)

    gc.collect()
    gc.freeze()
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def dispatch() -> None:
            for i in range(plan.size):
                delay = t0 + float(plan.send_s[i]) - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
                tasks.append(loop.create_task(one(i)))
            if tasks:
                await asyncio.wait(tasks)

        try:
            await asyncio.wait_for(dispatch(), timeout=max_duration_s)
        except TimeoutError:
            for t in tasks:
                t.cancel()
            with contextlib.suppress(Exception):
                await asyncio.gather(*tasks, return_exceptions=True)
            for rec in records[len(tasks) :]:
                rec.error = "not sent: the run's time limit was reached"
    bar.close()
    gc.unfreeze()
    return records, last_end - t0


def run_bench(config: BenchConfig) -> BenchResult:
    """Load the trace, replay it against the URLs, write ``summary.json`` and
    ``requests.parquet`` to ``config.out_dir`` and return them."""
    targets = resolve_targets(list(config.urls), config.endpoint)
    frame, source = load_workload(config.workload)
    if config.load is not None:
        ranks = config.ranks or len(targets)
        rate_scale = config.time_scale * rate_scale_for_load(
            to_arrays(frame), config.load, ranks, config.slots, resolve_cost(config.cost)
        )
    else:
        rate_scale = config.rate_scale or 1.0
    api_headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    model = config.model
    if model is None:
        model = asyncio.run(fetch_model(targets[0].base, api_headers, config.connect_timeout_s))
        if model is None:
            print(
                f"balanceroute bench: warning: {targets[0].base}/v1/models did not answer; "
                "sending requests without a model name",
                file=sys.stderr,
            )
    plan = make_plan(
        frame, targets, rate_scale=rate_scale, model=model, prompt_format=config.prompt_format
    )
    out = Path(config.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    max_duration = config.max_duration_s or float(plan.send_s[-1]) + config.request_timeout_s + 5
    records, duration = asyncio.run(run_plan(plan, config, max_duration))
    table = records_frame(plan, records)
    summary = summarize(table, duration)
    summary = {
        **summary,
        "num_prompts": plan.size,
        "rate_scale": rate_scale,
        "model_id": model,
        "urls": [t.url for t in targets],
        "source": source,
        "config": {**asdict(config), "api_key": "***" if config.api_key else None},
    }
    write_parquet(out / "requests.parquet", table)
    write_bytes(
        out / "summary.json",
        orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY, default=str),
    )
    return BenchResult(summary=summary, requests=table, out_dir=out)

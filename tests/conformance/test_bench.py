"""bench's counts and exit status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conformance.engine import Engine
from tests.conformance.fakes import AbortingRank
from tests.conformance.processes import run_bench, write_trace


def test_bench_fails_when_every_request_failed(engine: Engine, tmp_path: Path) -> None:
    """Every request refused (401: no key for a server that wants one): bench exits non-zero."""
    if engine.dp_url is None or engine.dp_api_key is None:
        pytest.skip("needs CONFORMANCE_DP_URL with CONFORMANCE_DP_API_KEY (a server with a key)")
    trace = write_trace(tmp_path / "trace.csv", 2, 4)
    done = run_bench(tmp_path, engine.dp_url, engine.model, "--trace", str(trace),
                     "--prompt-format", "ids", "--request-timeout", "30")  # fmt: skip
    summary = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert summary["completed"] == 0 and summary["failed"] == 2, summary
    assert done.returncode != 0, done.stdout[-500:]


def test_bench_counts_only_whole_requests(engine: Engine, tmp_path: Path) -> None:
    """Streams ended as vLLM ends them when stopped (finish_reason abort after a few tokens)
    are not completed: bench's ``completed`` counts requests that got what they asked for."""
    trace = write_trace(tmp_path / "trace.csv", 2, 50)
    with AbortingRank() as rank:
        run_bench(tmp_path, rank.url, engine.model, "--trace", str(trace), "--prompt-format",
                  "ids", "--request-timeout", "30")  # fmt: skip
    summary = json.loads((tmp_path / "bench" / "summary.json").read_text())
    assert summary["completed"] + summary["failed"] == 2, summary
    assert summary["completed"] == 0, summary

"""Per-request records as a table, and the run summary under ``vllm bench serve``'s key names.

Summary keys: ``duration`` (s, first send to last completion), ``completed``, ``failed``,
``total_input_tokens``, ``total_output_tokens``, ``request_throughput`` (completed / duration),
``output_throughput``, ``total_token_throughput``, and for ``ttft``, ``tpot``, ``itl`` and
``e2el``: ``mean_*_ms``, ``median_*_ms``, ``std_*_ms``, ``p95_*_ms``, ``p99_*_ms`` over the
completed requests (TPOT = (E2E - TTFT) / (tokens - 1) for requests of more than one token; ITL
over every gap between token events), plus ``output_mismatch`` (completed requests whose token
count differs from the ``max_tokens`` they asked for) and the most frequent ``errors``.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.serving.testbed.bench.client import RequestRecord
from balanceroute.serving.testbed.bench.plan import Plan

PERCENTILES = (95, 99)


def records_frame(plan: Plan, records: list[RequestRecord]) -> pd.DataFrame:
    """One row per planned request (sent or not), in plan order."""
    n = plan.size
    ttft = np.full(n, np.nan)
    e2e = np.full(n, np.nan)
    itl: list[np.ndarray] = []
    for r in records:
        t = np.frombuffer(r.token_s, dtype=np.float64) if len(r.token_s) else np.zeros(0)
        if t.size:
            ttft[r.index] = t[0]
            e2e[r.index] = t[-1]
        itl.append(np.diff(t).astype(np.float32))
    tokens = np.array([r.n_tokens for r in records], dtype=np.int64)
    tpot = np.where(tokens > 1, (e2e - ttft) / np.maximum(tokens - 1, 1), np.nan)
    targets = plan.targets
    return pd.DataFrame(
        {
            "index": np.arange(n, dtype=np.int64),
            "request_id": [plan.request_id(i) for i in range(n)],
            "trace_index": plan.trace_index,
            "url": [targets[int(t)].url for t in plan.target],
            "target": plan.target,
            "scheduled_s": plan.send_s,
            "start_s": [r.start_s for r in records],
            "queue_delay_s": [r.queue_s for r in records],
            "prompt_tokens": plan.prompt_tokens,
            "max_tokens": plan.output_tokens,
            "output_tokens": tokens,
            "token_events": [len(r.token_s) for r in records],
            "usage_completion_tokens": [r.usage_completion for r in records],
            "usage_prompt_tokens": [r.usage_prompt for r in records],
            "ttft_s": ttft,
            "tpot_s": tpot,
            "e2e_s": e2e,
            "itl_s": itl,
            "status": [r.status for r in records],
            "success": [r.success for r in records],
            "error": [r.error for r in records],
        }
    )


def _stats(values: np.ndarray, name: str) -> dict[str, float]:
    v = values[np.isfinite(values)] * 1000.0
    if v.size == 0:
        v = np.zeros(1)
    out = {
        f"mean_{name}_ms": float(v.mean()),
        f"median_{name}_ms": float(np.median(v)),
        f"std_{name}_ms": float(v.std()),
    }
    for p in PERCENTILES:
        out[f"p{p}_{name}_ms"] = float(np.percentile(v, p))
    return out


def summarize(frame: pd.DataFrame, duration_s: float) -> dict[str, Any]:
    """The summary of a run (see the module docstring for the keys)."""
    ok = frame[frame["success"]]
    completed = len(ok)
    total_in = int(ok["prompt_tokens"].sum())
    total_out = int(ok["output_tokens"].sum())
    dur = max(duration_s, 1e-9)
    itl = np.concatenate([*ok["itl_s"].to_list(), np.zeros(0, dtype=np.float32)]).astype(np.float64)
    errors = Counter(e for e in frame["error"] if e)
    summary: dict[str, Any] = {
        "duration": duration_s,
        "completed": completed,
        "failed": int(len(frame) - completed),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": completed / dur,
        "output_throughput": total_out / dur,
        "total_token_throughput": (total_in + total_out) / dur,
        **_stats(ok["ttft_s"].to_numpy(), "ttft"),
        **_stats(ok["tpot_s"].to_numpy(), "tpot"),
        **_stats(itl, "itl"),
        **_stats(ok["e2e_s"].to_numpy(), "e2el"),
        "output_mismatch": int((ok["output_tokens"] != ok["max_tokens"]).sum()),
        "errors": dict(errors.most_common(10)),
    }
    return summary

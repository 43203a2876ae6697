"""Run metrics (docs/design.md, "Model and metrics") derived from a :class:`SimResult`."""

from __future__ import annotations

from typing import Any

import numpy as np

from balanceroute.router.lab.simulator import SimResult

SUMMARY_KEYS = (
    "mean_imbalance",
    "steady_mean_imbalance",
    "throughput_tok_s",
    "tpot_p50_ms",
    "tpot_p95_ms",
    "queue_delay_p50_s",
    "queue_delay_p99_s",
    "max_queue_delay_s",
    "barrier_wait_fraction",
    "iterations",
    "completed_requests",
    "sim_wall_s",
    "router_step_us_p50",
    "router_step_us_p99",
)


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else 0.0


def steady_mask(result: SimResult) -> np.ndarray:
    """Iterations in the steady state: requests still waiting after admission (pool non-empty)."""
    return result.waiting > 0


def tpot_s(result: SimResult) -> np.ndarray:
    """Time per output token of each request: decode time / output tokens."""
    return (result.finish_s - result.admit_s) / result.output_tokens


def queue_delay_s(result: SimResult) -> np.ndarray:
    """Admission time minus release time, per request."""
    return result.admit_s - result.release_s


def summarize(result: SimResult) -> dict[str, Any]:
    """The run summary written to ``summary.json`` (see ``SUMMARY_KEYS``, plus extras)."""
    cfg = result.config
    steady = steady_mask(result)
    t_iter = np.diff(result.t_start)
    span_s = float(result.t_start[-1])
    out_tokens = int(result.output_tokens.sum())
    tpot = tpot_s(result)
    qd = queue_delay_s(result)
    router_us = result.router_ns / 1e3
    imb = result.imbalance
    summary: dict[str, Any] = {
        "mean_imbalance": float(imb.mean()) if imb.size else 0.0,
        "steady_mean_imbalance": float(imb[steady].mean()) if steady.any() else None,
        "steady_iterations": int(steady.sum()),
        "throughput_tok_s": out_tokens / span_s if span_s > 0 else 0.0,
        "steady_throughput_tok_s": _steady_throughput(result, steady),
        "tpot_p50_ms": 1e3 * _pct(tpot, 50),
        "tpot_p95_ms": 1e3 * _pct(tpot, 95),
        "queue_delay_p50_s": _pct(qd, 50),
        "queue_delay_p99_s": _pct(qd, 99),
        "max_queue_delay_s": float(qd.max()) if qd.size else 0.0,
        "max_overtaken": int(result.overtaken.max()) if result.overtaken.size else 0,
        "barrier_wait_fraction": (
            cfg.cost.t_token_s * float(imb.sum()) / (cfg.workers * float(t_iter.sum()))
            if t_iter.sum() > 0
            else 0.0
        ),
        "mean_max_load": float(result.max_load.mean()) if imb.size else 0.0,
        "iterations": result.iterations,
        "completed_requests": int((result.admit_iter >= 0).sum()),
        "output_tokens": out_tokens,
        "simulated_s": span_s,
        "sim_wall_s": result.sim_wall_s,
        "router_calls": int(router_us.size),
        "router_step_us_p50": _pct(router_us, 50),
        "router_step_us_p99": _pct(router_us, 99),
    }
    summary.update(result.extras)
    return summary


def _steady_throughput(result: SimResult, steady: np.ndarray) -> float | None:
    """Output tokens per second over steady iterations: running requests / iteration time."""
    if not steady.any():
        return None
    t_iter = np.diff(result.t_start)
    running = _running_per_iteration(result)
    return float(running[steady].sum() / t_iter[steady].sum())


def _running_per_iteration(result: SimResult) -> np.ndarray:
    """Requests emitting a token in each iteration (prefilling ones do not)."""
    k = result.iterations
    delta = np.zeros(k + 1, dtype=np.int64)
    first = result.first_iter
    np.add.at(delta, first, 1)
    np.add.at(delta, np.minimum(first + result.output_tokens, k), -1)
    return np.cumsum(delta)[:k]

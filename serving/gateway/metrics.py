"""The gateway's Prometheus metrics (``GET /metrics``), names prefixed ``balanceroute_gateway_``.

Per rank: running requests, KV load, health. The group: live imbalance (max minus mean of the
per-rank loads, every tick) as a histogram, pool size, admission wait, TTFT and TPOT seen at the
gateway, decisions and router step time, prediction fallbacks, re-routes and requests by outcome,
the event loop's lag (:class:`LoopLag`);
everything the arms change is labelled by arm. The live twins (:mod:`.twins`): weight, blocks
judged, switches, CPU seconds and lag per driven arm; the twins' process's CPU seconds (the twins
and the switchback's counterfactual, what the CPU cap bounds), whether it is up and its
restarts, and the counterfactual's blocks.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

P = "balanceroute_gateway_"
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
                2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # fmt: skip
STEP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                0.1)  # fmt: skip
LOAD_BUCKETS = tuple(float(x) for x in (0, 100, 250, 500, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5,
                                        2.5e5, 5e5, 1e6))  # fmt: skip


# attribute: (kind, name, help, labels, buckets); every collector in one registry per gateway
SPECS: dict[str, tuple[type, str, str, tuple[str, ...], tuple[float, ...] | None]] = {
    "running": (Gauge, "rank_running_requests", "requests in flight", ("rank",), None),
    "load": (Gauge, "rank_kv_load_tokens", "KV tokens tracked", ("rank",), None),
    "healthy": (Gauge, "rank_healthy", "1 while in rotation", ("rank",), None),
    "imbalance": (Histogram, "imbalance_tokens",
                  "max minus mean of the per-rank KV loads, sampled every tick", ("arm",),
                  LOAD_BUCKETS),
    "pool": (Gauge, "pool_size", "requests waiting in the gateway's pool", (), None),
    "wait": (Histogram, "admission_wait_seconds", "arrival at the gateway to forward", ("arm",),
             TIME_BUCKETS),
    "ttft": (Histogram, "ttft_seconds", "arrival to first token", ("arm",), TIME_BUCKETS),
    "tpot": (Histogram, "tpot_seconds", "time per output token after the first", ("arm",),
             TIME_BUCKETS),
    "decisions": (Counter, "decisions", "routing calls", ("arm",), None),
    "step": (Histogram, "router_step_seconds", "time of one routing call (policy.route)",
             ("arm",), STEP_BUCKETS),
    "admitted": (Counter, "admissions", "requests forwarded", ("arm",), None),
    "fallbacks": (Counter, "prediction_fallbacks",
                  "predictions answered by the local fallback (prediction service down or slow)",
                  ("arm",), None),
    "reroutes": (Counter, "reroutes", "requests sent back to the pool by a failed rank",
                 ("rank",), None),
    "outcomes": (Counter, "requests", "requests by outcome", ("outcome",), None),
    "reloads": (Counter, "reloads", "model reloads by outcome", ("outcome",), None),
    "loop_lag": (Histogram, "loop_lag_seconds", "how late the event loop ran a 100 ms timer (a "
                 "loop waiting for the GIL or a long callback)", (), TIME_BUCKETS),
    "arm": (Gauge, "active_arm", "1 for the arm routing now", ("arm",), None),
    "twin_weight": (Gauge, "twin_weight",
                    "live twin: the blend weight w of the arm's projection (0: no prediction)",
                    ("arm",), None),
    "twin_blocks": (Gauge, "twin_blocks", "live twin: blocks of finished requests judged "
                    "(replayed under every candidate)", ("arm",), None),
    "twin_switches": (Gauge, "twin_switches", "live twin: weight switches", ("arm",), None),
    "twin_cpu": (Gauge, "twin_cpu_seconds", "live twin: CPU seconds of its work", ("arm",), None),
    "twin_lag": (Gauge, "twin_lag_blocks",
                 "live twin: complete blocks not yet replayed (blocks behind)", ("arm",), None),
    "twin_worker_cpu": (Gauge, "twin_worker_cpu_seconds", "the live twins' process: CPU seconds "
                        "of every twin and the counterfactual comparison (the child's whole CPU, "
                        "every child so far; what the CPU cap bounds)", (), None),
    "twin_process_up": (Gauge, "twin_process_up", "the live twins' process: 1 running, 0 down "
                        "(the driven arms route at w = 0), restarting or off", (), None),
    "twin_process_restarts": (Gauge, "twin_process_restarts",
                              "the live twins' process: restarts after a death", (), None),
    "twin_comparison_blocks": (Gauge, "twin_comparison_blocks",
                               "the switchback's counterfactual: blocks replayed under every arm",
                               (), None),
}  # fmt: skip


class GatewayMetrics:
    """The collectors of :data:`SPECS` as attributes, in a registry of their own (one per
    gateway)."""

    running: Gauge
    load: Gauge
    healthy: Gauge
    imbalance: Histogram
    pool: Gauge
    wait: Histogram
    ttft: Histogram
    tpot: Histogram
    decisions: Counter
    step: Histogram
    admitted: Counter
    fallbacks: Counter
    reroutes: Counter
    outcomes: Counter
    reloads: Counter
    loop_lag: Histogram
    arm: Gauge
    twin_weight: Gauge
    twin_blocks: Gauge
    twin_switches: Gauge
    twin_cpu: Gauge
    twin_lag: Gauge
    twin_worker_cpu: Gauge
    twin_process_up: Gauge
    twin_process_restarts: Gauge
    twin_comparison_blocks: Gauge

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        for attr, (kind, name, doc, labels, buckets) in SPECS.items():
            extra: dict[str, Any] = {} if buckets is None else {"buckets": buckets}
            setattr(self, attr, kind(P + name, doc, list(labels), registry=self.registry, **extra))
        self.accepted = self.outcomes.labels("accepted")  # every request: the lookup once

    def twins(
        self,
        rows: dict[str, dict[str, Any]],
        worker_cpu_s: float | None = None,
        comparison: dict[str, Any] | None = None,
        process: dict[str, Any] | None = None,
    ) -> None:
        """The live twins' state by arm, their process's CPU, life and the counterfactual's
        blocks (set when ``/metrics`` is scraped)."""
        if process is not None:
            self.twin_process_up.set(1.0 if process["state"] == "running" else 0.0)
            self.twin_process_restarts.set(process["restarts"])
        if worker_cpu_s is not None:
            self.twin_worker_cpu.set(worker_cpu_s)
        if comparison is not None:
            self.twin_comparison_blocks.set(comparison["blocks"])
        for arm, row in rows.items():
            self.twin_weight.labels(arm).set(row["twin_weight"])
            self.twin_blocks.labels(arm).set(row["twin_decisions"])
            self.twin_switches.labels(arm).set(row["twin_switches"])
            self.twin_cpu.labels(arm).set(row["twin_cpu_s"])
            self.twin_lag.labels(arm).set(row["twin_lag_blocks"])


# ---- the event loop's lag -----------------------------------------------------------------------
# Every ``period_s`` the sampler sleeps until a due time and, when the loop wakes it, records how
# long after that time it ran. A loop that waits for the GIL (a CPU-bound thread in the process,
# such as the live twins') or runs a long callback shows it here before it shows in the ticks,
# the health checks or ``/metrics`` answering late. The last :data:`KEEP` samples give the p50,
# p99 and max in ``/v1/ab`` (``loop_lag``). The gateway feeds :meth:`LoopLag.record` from its
# decision loop's regular sample (:meth:`~.dispatch.Dispatcher.run`) rather than running
# :meth:`LoopLag.run`: one timer fewer.

PERIOD_S = 0.1  # one sample every 100 ms
KEEP = 36_000  # samples kept for the summary: one hour at PERIOD_S


class LoopLag:
    """Samples the running loop's lateness into ``histogram`` and a bounded window."""

    def __init__(self, histogram: Histogram, period_s: float = PERIOD_S, keep: int = KEEP) -> None:
        if not period_s > 0:
            raise ValueError(f"loop-lag period_s must be > 0, got {period_s}")
        self.histogram = histogram
        self.period_s = period_s
        self.samples: deque[float] = deque(maxlen=keep)
        self.max_s = 0.0
        self.count = 0

    def record(self, lag_s: float) -> None:
        """One sample: the loop ran the timer ``lag_s`` after its due time (never negative)."""
        lag = max(0.0, lag_s)
        self.histogram.observe(lag)
        self.samples.append(lag)
        self.max_s = max(self.max_s, lag)
        self.count += 1

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period_s
            await asyncio.sleep(self.period_s)
            self.record(loop.time() - due)

    def summary(self) -> dict[str, Any]:
        """p50, p99 and max of the kept samples (seconds), the max since start and the count."""
        out: dict[str, Any] = {"samples": self.count, "max_s": round(self.max_s, 6),
                               "period_s": self.period_s}  # fmt: skip
        if self.samples:
            a = np.fromiter(self.samples, dtype=float, count=len(self.samples))
            p50, p99 = np.percentile(a, [50, 99])
            out.update(p50_s=round(float(p50), 6), p99_s=round(float(p99), 6),
                       window_max_s=round(float(a.max()), 6))  # fmt: skip
        return out

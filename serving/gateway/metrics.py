"""The gateway's Prometheus metrics (``GET /metrics``), names prefixed ``balanceroute_gateway_``.

Per rank: running requests, KV load, health. The group: live imbalance (max minus mean of the
per-rank loads, every tick) as a histogram, pool size, admission wait, TTFT and TPOT seen at the
gateway, decisions and router step time, prediction fallbacks, re-routes and requests by outcome,
the event loop's lag (:mod:`.looplag`);
everything the arms change is labelled by arm. The live twins (:mod:`.twins`): weight, blocks
judged, switches, CPU seconds and lag per driven arm; the twins' process's CPU seconds (the twins
and the switchback's counterfactual, what the CPU cap bounds), whether it is up and its
restarts, and the counterfactual's blocks.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

P = "balanceroute_gateway_"
TIME_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0,
                2.5, 5.0, 10.0, 30.0, 60.0, 120.0)  # fmt: skip
STEP_BUCKETS = (1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 0.01, 0.025, 0.05,
                0.1)  # fmt: skip
LOAD_BUCKETS = tuple(float(x) for x in (0, 100, 250, 500, 1e3, 2.5e3, 5e3, 1e4, 2.5e4, 5e4, 1e5,
                                        2.5e5, 5e5, 1e6))  # fmt: skip


class GatewayMetrics:
    """The collectors, in a registry of their own (one per app)."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.running = Gauge(
            P + "rank_running_requests", "requests in flight", ["rank"], registry=r
        )
        self.load = Gauge(P + "rank_kv_load_tokens", "KV tokens tracked", ["rank"], registry=r)
        self.healthy = Gauge(P + "rank_healthy", "1 while in rotation", ["rank"], registry=r)
        self.imbalance = Histogram(
            P + "imbalance_tokens",
            "max minus mean of the per-rank KV loads, sampled every tick",
            ["arm"],
            buckets=LOAD_BUCKETS,
            registry=r,
        )
        self.pool = Gauge(P + "pool_size", "requests waiting in the gateway's pool", registry=r)
        self.wait = Histogram(
            P + "admission_wait_seconds",
            "arrival at the gateway to forward",
            ["arm"],
            buckets=TIME_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            P + "ttft_seconds", "arrival to first token", ["arm"], buckets=TIME_BUCKETS, registry=r
        )
        self.tpot = Histogram(
            P + "tpot_seconds",
            "time per output token after the first",
            ["arm"],
            buckets=TIME_BUCKETS,
            registry=r,
        )
        self.decisions = Counter(P + "decisions", "routing calls", ["arm"], registry=r)
        self.step = Histogram(
            P + "router_step_seconds",
            "time of one routing call (policy.route)",
            ["arm"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        self.admitted = Counter(P + "admissions", "requests forwarded", ["arm"], registry=r)
        self.fallbacks = Counter(
            P + "prediction_fallbacks",
            "predictions answered by the local fallback (prediction service down or slow)",
            ["arm"],
            registry=r,
        )
        self.reroutes = Counter(
            P + "reroutes", "requests sent back to the pool by a failed rank", ["rank"], registry=r
        )
        self.outcomes = Counter(P + "requests", "requests by outcome", ["outcome"], registry=r)
        self.reloads = Counter(P + "reloads", "model reloads by outcome", ["outcome"], registry=r)
        self.loop_lag = Histogram(
            P + "loop_lag_seconds",
            "how late the event loop ran a 100 ms timer (a loop waiting for the GIL or a long "
            "callback)",
            buckets=TIME_BUCKETS,
            registry=r,
        )
        self.arm = Gauge(P + "active_arm", "1 for the arm routing now", ["arm"], registry=r)
        self.twin_weight = Gauge(
            P + "twin_weight",
            "live twin: the blend weight w of the arm's projection (0: no prediction)",
            ["arm"],
            registry=r,
        )
        self.twin_blocks = Gauge(
            P + "twin_blocks",
            "live twin: blocks of finished requests judged (replayed under every candidate)",
            ["arm"],
            registry=r,
        )
        self.twin_switches = Gauge(P + "twin_switches", "live twin: weight switches", ["arm"],
                                   registry=r)  # fmt: skip
        self.twin_cpu = Gauge(
            P + "twin_cpu_seconds", "live twin: CPU seconds of its work", ["arm"], registry=r
        )
        self.twin_lag = Gauge(
            P + "twin_lag_blocks",
            "live twin: complete blocks not yet replayed (blocks behind)",
            ["arm"],
            registry=r,
        )

        self.twin_worker_cpu = Gauge(
            P + "twin_worker_cpu_seconds",
            "the live twins' process: CPU seconds of every twin and the counterfactual comparison "
            "(the child's whole CPU, every child so far; what the CPU cap bounds)",
            registry=r,
        )
        self.twin_process_up = Gauge(
            P + "twin_process_up",
            "the live twins' process: 1 running, 0 down (the driven arms route at w = 0), "
            "restarting or off",
            registry=r,
        )
        self.twin_process_restarts = Gauge(
            P + "twin_process_restarts", "the live twins' process: restarts after a death",
            registry=r,
        )
        self.twin_comparison_blocks = Gauge(
            P + "twin_comparison_blocks",
            "the switchback's counterfactual: blocks replayed under every arm",
            registry=r,
        )

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

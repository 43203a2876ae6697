"""Prometheus metrics of the service, in a registry of its own (one per app instance).

Latency and counts per endpoint and model slot come from an ASGI middleware that times every
call; the handlers tag the slot that answered and record batch sizes and fallbacks. The label is
still called ``arm`` (and the request state key with it): dashboards and alerts select on it.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

if TYPE_CHECKING:
    from balanceroute.serving.lifecycle.renew import ReloadOutcome
    from balanceroute.serving.service.models import LoadedModel

LATENCY_BUCKETS = (
    0.0005,
    0.001,
    0.002,
    0.003,
    0.005,
    0.0075,
    0.01,
    0.015,
    0.02,
    0.03,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)
SIZE_BUCKETS = tuple(float(2**i) for i in range(15))


class ServiceMetrics:
    """The service's collectors; ``registry`` is what ``GET /metrics`` exposes."""

    def __init__(self) -> None:
        self.registry = r = CollectorRegistry()
        self.requests = Counter(
            "balanceroute_http_requests",
            "HTTP calls by endpoint, arm and status",
            ["endpoint", "arm", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "balanceroute_http_request_seconds",
            "HTTP call latency by endpoint and arm",
            ["endpoint", "arm"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.batch_size = Histogram(
            "balanceroute_batch_size",
            "requests (or completions, pool entries) per call",
            ["endpoint"],
            buckets=SIZE_BUCKETS,
            registry=r,
        )
        self.fallbacks = Counter(
            "balanceroute_fallbacks",
            "route calls answered without the model's predictions",
            ["endpoint", "reason"],
            registry=r,
        )
        self.observed = Counter(
            "balanceroute_observed_completions", "completions fed to the estimators", registry=r
        )
        self.reloads = Counter(
            "balanceroute_reloads",
            "model (re)loads by arm and outcome",
            ["arm", "outcome"],
            registry=r,
        )
        twin = ("arm", "policy")
        self.twin_weight = Gauge(
            "balanceroute_route_twin_weight",
            "live twin of /v1/route: the blend weight w of BR-H's projection (0: no prediction)",
            twin,
            registry=r,
        )
        self.twin_blocks = Gauge(
            "balanceroute_route_twin_blocks",
            "live twin: blocks of finished requests judged (replayed under every candidate)",
            twin,
            registry=r,
        )
        self.twin_switches = Gauge(
            "balanceroute_route_twin_switches", "live twin: weight switches", twin, registry=r
        )
        self.twin_cpu = Gauge(
            "balanceroute_route_twin_cpu_seconds",
            "live twin: CPU seconds of its background thread",
            twin,
            registry=r,
        )
        self.twin_lag = Gauge(
            "balanceroute_route_twin_lag_blocks",
            "live twin: complete blocks not yet replayed (blocks behind)",
            twin,
            registry=r,
        )
        self.model_info = Gauge(
            "balanceroute_model_info",
            "1 for the model version each arm serves",
            ["arm", "name", "version", "kind", "source"],
            registry=r,
        )

    def swapped(self, slot: str, old: LoadedModel | None, new: LoadedModel) -> None:
        """A new version serves ``slot``: move the info series and count the load."""
        if old is not None:
            self.model_info.remove(*_info_labels(old))
        self.model_info.labels(*_info_labels(new)).set(1)

    def twins(self, rows: list[dict[str, Any]]) -> None:
        """The live twins' state (set when ``/metrics`` is scraped); gone twins leave."""
        gauges = (self.twin_weight, self.twin_blocks, self.twin_switches, self.twin_cpu,
                  self.twin_lag)  # fmt: skip
        for g in gauges:
            g.clear()
        for row in rows:
            labels = (row["arm"], row["policy"])
            self.twin_weight.labels(*labels).set(row["twin_weight"])
            self.twin_blocks.labels(*labels).set(row["twin_decisions"])
            self.twin_switches.labels(*labels).set(row["twin_switches"])
            self.twin_cpu.labels(*labels).set(row["twin_cpu_s"])
            self.twin_lag.labels(*labels).set(row["twin_lag_blocks"])

    def reloaded(self, o: ReloadOutcome) -> None:
        """Count what a (re)load did to one arm."""
        outcome = "error" if o.error else ("changed" if o.changed else "unchanged")
        self.reloads.labels(o.arm, outcome).inc()


def _info_labels(m: LoadedModel) -> tuple[str, ...]:
    r = m.resolved
    return (m.slot, r.name, r.version, m.kind, r.source)


class MetricsMiddleware:
    """Times every HTTP call; the endpoint is the matched route's path template."""

    def __init__(self, app: ASGIApp, metrics: ServiceMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            route = scope.get("route")
            endpoint = getattr(route, "path", None) or "unmatched"
            arm = scope.get("state", {}).get("arm", "")
            m = self.metrics
            m.latency.labels(endpoint, arm).observe(time.perf_counter() - start)
            m.requests.labels(endpoint, arm, str(status)).inc()

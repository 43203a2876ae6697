"""Per-rank Prometheus metrics under vLLM's names, rendered as text on ``GET /metrics``.

Names, label names (``model_name``, ``engine``) and histogram buckets follow vLLM's v1
Prometheus logger: ``vllm:num_requests_running`` / ``vllm:num_requests_waiting`` /
``vllm:kv_cache_usage_perc`` (gauges), ``vllm:prompt_tokens_total`` /
``vllm:generation_tokens_total`` / ``vllm:request_success_total{finished_reason}`` (counters),
``vllm:time_per_output_token_seconds`` (one observation per output token after a request's
first), ``vllm:time_to_first_token_seconds``, ``vllm:e2e_request_latency_seconds`` and
``vllm:iteration_tokens_total`` (one observation per engine step the rank ran: its ``_count`` is
the rank's step counter) (histograms). The histograms are tiny counting arrays rather than ``prometheus_client`` objects:
every running request of a rank sees the same inter-token interval in an iteration, so one
weighted observation per iteration replaces one call per token.
"""

from __future__ import annotations

from bisect import bisect_left

TPOT_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
               120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip
ITERATION_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
FINISH_REASONS = ("stop", "length", "abort")


class Histogram:
    """Cumulative-on-render bucket counts with weighted observations."""

    __slots__ = ("buckets", "count", "counts", "sum")

    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float, n: int = 1) -> None:
        """Record ``n`` observations of ``value``."""
        self.counts[bisect_left(self.buckets, value)] += n
        self.sum += value * n
        self.count += n

    def render(self, name: str, labels: str, help_: str) -> list[str]:
        """Prometheus text lines of this histogram."""
        out = [f"# HELP {name} {help_}", f"# TYPE {name} histogram"]
        acc = 0
        for le, c in zip(self.buckets, self.counts, strict=False):
            acc += c
            out.append(f'{name}_bucket{{{labels},le="{le}"}} {float(acc)}')
        out.append(f'{name}_bucket{{{labels},le="+Inf"}} {float(self.count)}')
        out.append(f"{name}_count{{{labels}}} {float(self.count)}")
        out.append(f"{name}_sum{{{labels}}} {self.sum}")
        return out


class RankMetrics:
    """Counters and histograms of one rank (gauges are read from the rank when rendering)."""

    __slots__ = ("e2e", "generation_tokens", "iteration_tokens", "labels", "prompt_tokens",
                 "success", "tpot", "ttft")  # fmt: skip

    def __init__(self, model: str, rank: int) -> None:
        self.labels = f'model_name="{model}",engine="{rank}"'
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.success = dict.fromkeys(FINISH_REASONS, 0)
        self.tpot = Histogram(TPOT_BUCKETS)
        self.ttft = Histogram(TTFT_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        self.iteration_tokens = Histogram(ITERATION_BUCKETS)  # one observation per step run

    def render(self, running: int, waiting: int, kv_usage: float) -> str:
        """The whole ``/metrics`` page of this rank."""
        lb = self.labels
        lines = [
            "# HELP vllm:num_requests_running Number of requests in model execution batches.",
            "# TYPE vllm:num_requests_running gauge",
            f"vllm:num_requests_running{{{lb}}} {float(running)}",
            "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.",
            "# TYPE vllm:num_requests_waiting gauge",
            f"vllm:num_requests_waiting{{{lb}}} {float(waiting)}",
            "# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.",
            "# TYPE vllm:kv_cache_usage_perc gauge",
            f"vllm:kv_cache_usage_perc{{{lb}}} {kv_usage}",
            "# HELP vllm:prompt_tokens_total Number of prefill tokens processed.",
            "# TYPE vllm:prompt_tokens_total counter",
            f"vllm:prompt_tokens_total{{{lb}}} {float(self.prompt_tokens)}",
            "# HELP vllm:generation_tokens_total Number of generation tokens processed.",
            "# TYPE vllm:generation_tokens_total counter",
            f"vllm:generation_tokens_total{{{lb}}} {float(self.generation_tokens)}",
            "# HELP vllm:request_success_total Count of successfully processed requests.",
            "# TYPE vllm:request_success_total counter",
        ]
        for reason, n in self.success.items():
            lines.append(
                f'vllm:request_success_total{{{lb},finished_reason="{reason}"}} {float(n)}'
            )
        lines += self.tpot.render(
            "vllm:time_per_output_token_seconds",
            lb,
            "Histogram of time per output token in seconds.",
        )
        lines += self.ttft.render(
            "vllm:time_to_first_token_seconds", lb, "Histogram of time to first token in seconds."
        )
        lines += self.e2e.render(
            "vllm:e2e_request_latency_seconds", lb, "Histogram of e2e request latency in seconds."
        )
        lines += self.iteration_tokens.render(
            "vllm:iteration_tokens_total", lb, "Histogram of number of tokens per engine_step."
        )
        return "\n".join(lines) + "\n"


def parse_metrics(text: str) -> dict[str, float]:
    """Sample name (with its labels) to value, from Prometheus text (for tests and tools)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name, _, value = line.rpartition(" ")
        out[name] = float(value)
    return out


def metric_total(samples: dict[str, float], name: str, **labels: str) -> float:
    """Sum of every sample of ``name`` whose labels include ``labels``."""
    total = 0.0
    for key, value in samples.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total

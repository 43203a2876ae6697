"""The prefill tier: turns request arrivals into batched releases into the decode pool.

``P`` prefill instances serve arrivals first come first served. A free instance takes every
request that has arrived, up to ``max_batch_tokens`` prompt tokens (at least one request), works
for ``t_fixed_s + t_token_s * batch_tokens`` and releases the whole batch at once. Arrival times
are divided by ``rate_scale`` first (2.0 = twice as fast); ``saturate`` releases every request
at time 0, the regime of the paper's theorem.

The defaults (4 instances, 40,000 prompt tokens/s each) keep prefill well ahead of the decode
tier for every shipped workload, so releases are bursty but prefill is never the bottleneck.
"""

from __future__ import annotations

import heapq
from dataclasses import asdict, dataclass

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.features.schema import TraceArrays
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.policies.state import RequestTable


@dataclass(frozen=True, slots=True)
class PrefillConfig:
    """Prefill tier and arrival scaling."""

    instances: int = 4  # 0: as many as the offered load needs (sized_prefill)
    max_batch_tokens: int = 32_768
    t_fixed_s: float = 0.010
    t_token_s: float = 25e-6
    rate_scale: float = 1.0
    saturate: bool = False

    def __post_init__(self) -> None:
        if self.instances < 0:
            raise UserError(f"prefill instances must be >= 1 (or 0 for auto), got {self.instances}")
        if not self.rate_scale > 0:
            raise UserError(f"rate scale must be > 0, got {self.rate_scale}")
        if self.max_batch_tokens < 1:
            raise UserError(f"max batch tokens must be >= 1, got {self.max_batch_tokens}")

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class ReleasedRequests:
    """Requests in release order: what the decode simulator replays."""

    release_s: np.ndarray  # float64 (N,), non-decreasing
    prompt_tokens: np.ndarray  # int64 (N,)
    output_tokens: np.ndarray  # int64 (N,), hidden from policies
    table: RequestTable

    @property
    def size(self) -> int:
        return int(self.release_s.shape[0])


def prefill_release_times(
    arrival_s: np.ndarray, prompt_tokens: np.ndarray, cfg: PrefillConfig
) -> np.ndarray:
    """Release time of every request (arrival order in, same order out)."""
    n = arrival_s.shape[0]
    if cfg.saturate:
        return np.zeros(n)
    arrival = np.asarray(arrival_s, dtype=np.float64) / cfg.rate_scale
    csum = np.concatenate(([0], np.cumsum(prompt_tokens, dtype=np.int64)))
    release = np.empty(n)
    free_at = [0.0] * cfg.instances
    heapq.heapify(free_at)
    i = 0
    while i < n:
        start = max(heapq.heappop(free_at), arrival[i])
        arrived = int(np.searchsorted(arrival, start, side="right"))
        budget_end = int(np.searchsorted(csum, csum[i] + cfg.max_batch_tokens, side="right")) - 1
        j = max(i + 1, min(arrived, budget_end))
        end = start + cfg.t_fixed_s + cfg.t_token_s * float(csum[j] - csum[i])
        release[i:j] = end
        heapq.heappush(free_at, end)
        i = j
    return release


def decode_capacity_rps(
    prompt_tokens: np.ndarray, output_tokens: np.ndarray, workers: int, slots: int, cost: CostModel
) -> float:
    """Requests/s a fully occupied, balanced decode tier completes (an estimate).

    A slot's mean workload over a request's life is ``E[S*O + O(O-1)/2] / E[O]``; the
    balanced iteration time follows from the cost model.
    """
    s = prompt_tokens.astype(np.float64)
    o = output_tokens.astype(np.float64)
    slot_load = float(np.mean(s * o + o * (o - 1) / 2) / np.mean(o))
    t_iter = float(cost.iteration_time(slots * slot_load))
    return workers * slots / (float(np.mean(o)) * t_iter)


def prefill_capacity_rps(prompt_tokens: np.ndarray, cfg: PrefillConfig) -> float:
    """Requests/s the prefill tier completes when every instance runs full batches."""
    batch = float(cfg.max_batch_tokens)
    per_instance_tokens = batch / (cfg.t_fixed_s + cfg.t_token_s * batch)
    return max(cfg.instances, 1) * per_instance_tokens / float(np.mean(prompt_tokens))


PREFILL_HEADROOM = 1.25


def sized_prefill(trace: TraceArrays, cfg: PrefillConfig, rps: float) -> PrefillConfig:
    """``cfg`` with ``instances = 0`` resolved: enough instances for ``rps`` arrivals/s with
    :data:`PREFILL_HEADROOM` to spare (others unchanged)."""
    if cfg.instances > 0:
        return cfg
    one = prefill_capacity_rps(
        trace.prompt_tokens, PrefillConfig(**{**asdict(cfg), "instances": 1})
    )
    need = int(np.ceil(PREFILL_HEADROOM * rps / one))
    return PrefillConfig(**{**asdict(cfg), "instances": max(1, need)})


def arrival_rps(trace: TraceArrays, rate_scale: float) -> float | None:
    """Mean arrivals/s of the trace after scaling (None when all arrive at once)."""
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    return None if span <= 0 else (trace.size - 1) / span * rate_scale


def rate_scale_for_load(
    trace: TraceArrays, load: float, workers: int, slots: int, cost: CostModel
) -> float:
    """Rate scale that makes arrivals ``load`` times the estimated decode capacity."""
    if not load > 0:
        raise UserError(f"offered load must be > 0, got {load}")
    span = float(trace.arrival_s[-1] - trace.arrival_s[0])
    if span <= 0:
        raise UserError("cannot scale to a load: every request arrives at the same time")
    trace_rps = (trace.size - 1) / span
    cap = decode_capacity_rps(trace.prompt_tokens, trace.output_tokens, workers, slots, cost)
    return load * cap / trace_rps


def release(trace: TraceArrays, cfg: PrefillConfig) -> ReleasedRequests:
    """Run the prefill tier and return requests sorted by release time (ties keep trace order)."""
    times = prefill_release_times(trace.arrival_s, trace.prompt_tokens, cfg)
    order = np.argsort(times, kind="stable")
    return ReleasedRequests(
        release_s=np.ascontiguousarray(times[order]),
        prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[order]),
        output_tokens=np.ascontiguousarray(trace.output_tokens[order]),
        table=RequestTable(
            prompt_tokens=np.ascontiguousarray(trace.prompt_tokens[order]),
            prompt_key=np.ascontiguousarray(trace.prompt_key[order]),
            trace_index=order.astype(np.int64),
        ),
    )

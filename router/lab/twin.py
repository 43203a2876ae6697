"""The decode group's digital twin: it chooses how much BR-H trusts its estimator.

BR-H scores admissions against ``P_w = P0 - w (P0 - P)``: ``P0`` projects every running request
to survive, ``P`` is the estimator's projection, ``w`` the blend weight. The twin replays the
group's recent traffic in the simulator under every candidate ``w`` and keeps the one that
balances best, judged on what the closed loop does (docs/design.md, "The twin").

- **Blocks.** Requests are numbered in arrival order; a block is ``M`` consecutive ones. A block
  is replayed only once *all* its requests have finished (their output lengths are known): no
  survivorship bias (a block is never only the requests that happened to finish).
- **Leakage.** The twin's estimator is its own copy (:class:`ShadowEstimator`), taken before
  any replayed request arrived, that learns only from requests finished before the first
  arrival of the block it replays (prequential), in finish order.
- **Paired replays.** Every candidate replays the same block with the same releases and seed;
  the evidence is the log ratio of each candidate's steady imbalance to ``w = 0``'s.
- **Sequential test with hysteresis** (:class:`SequentialTest`). Over the last ``memory``
  blocks, the twin moves from its current weight to the candidate whose mean paired log ratio
  *to the current one* has the lowest upper confidence bound, only if that bound is below
  ``-margin``, at least ``min_windows`` blocks are in, and ``cooldown`` blocks have passed since
  the last switch. It starts at ``w = 0`` (no prediction: do no harm).
- **Causality and cost.** The twin only knows completions it was shown; it runs off the routing
  path (the simulator's untimed ``background`` hook, a service's idle thread) under a budget of
  simulated iterations per live iteration, and reports its CPU time.
"""

from __future__ import annotations

import copy
import heapq
import math
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletedBatch, CompletionEstimator
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import Admissions, RequestTable, RouterState

# A block holds this many group-fulls of requests: shorter replays rank the estimator unlike
# the closed loop (paper-prod, G = 8, B = 32 saturated: brh:gbdt unguarded vs brh:none is 1.07
# [1.03, 1.12] over 30 windows of 512 requests and 0.77 [0.69, 0.87] over windows of 2,048).
BLOCK_SLOT_MULTIPLE = 8
MIN_BLOCK_REQUESTS = 128
MIN_STEADY = 20  # steady iterations every candidate needs for the steady metric


@dataclass(frozen=True)
class TwinConfig:
    """How the twin decides: candidates, blocks, the sequential test and its budget."""

    candidates: tuple[float, ...] = (0.0, 0.5, 1.0)
    block_requests: int | None = None  # None: BLOCK_SLOT_MULTIPLE * G * B
    overlap: int = 2  # a block starts every block_requests / overlap arrivals
    min_windows: int = 6  # blocks before the first switch
    memory: int = 48  # blocks the test remembers (a sliding window)
    z: float = 2.0  # one-sided bound: mean + z * se of the paired log ratio
    margin: float = 0.01  # the bound must be below -margin (about 1% better) to switch
    cooldown: int = 4  # blocks after a switch before the next one
    start_weight: float = 0.0
    # simulated twin iterations per live iteration at most: about 4% of one core beside a
    # G = 8, B = 64 group at 60 ms iterations on this machine (0.47 ms a twin iteration with
    # gbdt, benchmarks/perf/router_latency.py); a twin behind skips to the newest block
    work_ratio: float = 5.0
    # the live twin's thread (service, gateway) uses at most this share of one core over its
    # life: a step waits until the thread's CPU plus the last step's cost fits (issue 19's
    # target is 5%; simulate and ab, which have no wall clock, ignore it); None: no cap
    cpu_share: float | None = 0.04
    # share of an on-the-fly estimator's training portion the twin replays before the run
    # (its own estimator fits on the rest, the earlier part): evidence before the first
    # window, leakage-free (router/lab/twin_warmup.py); 0 turns the warm start off
    warm_start: float = 2 / 3

    def __post_init__(self) -> None:
        if not 0.0 <= self.warm_start < 1.0:
            raise ValueError(f"warm_start must be in [0, 1), got {self.warm_start}")
        if 0.0 not in self.candidates or self.start_weight not in self.candidates:
            raise ValueError("the candidates must hold 0 and the start weight")
        if self.overlap < 1:
            raise ValueError(f"overlap must be >= 1, got {self.overlap}")
        if any(not 0.0 <= c <= 1.0 for c in self.candidates):
            raise ValueError(f"candidates must be in [0, 1], got {self.candidates}")
        if self.cpu_share is not None and not 0.0 < self.cpu_share <= 1.0:
            raise ValueError(f"cpu_share must be in (0, 1] or None, got {self.cpu_share}")

    def block_size(self, workers: int, slots: int) -> int:
        """Requests per block for a group of ``workers`` x ``slots``."""
        if self.block_requests is not None:
            return self.block_requests
        return max(MIN_BLOCK_REQUESTS, BLOCK_SLOT_MULTIPLE * workers * slots)


@dataclass(frozen=True)
class TwinGroup:
    """The group the twin imitates: its shape, cost model, seed and the live router's spec."""

    router: RouterSpec
    workers: int
    slots: int
    cost: CostModel = field(default_factory=CostModel)
    seed: int = 0


@dataclass(frozen=True)
class Finished:
    """Requests that finished: arrival number, release time, prompt, key, output, finish."""

    index: np.ndarray  # int64 arrival order (0, 1, ...)
    release_s: np.ndarray
    prompt_tokens: np.ndarray
    prompt_key: np.ndarray
    trace_index: np.ndarray
    output_tokens: np.ndarray
    finish_s: np.ndarray

    def take(self, sel: np.ndarray) -> Finished:
        return Finished(*(getattr(self, f)[sel] for f in self.__dataclass_fields__))

    @staticmethod
    def concat(parts: list[Finished]) -> Finished:
        names = list(Finished.__dataclass_fields__)
        return Finished(*(np.concatenate([getattr(p, n) for p in parts]) for n in names))


class SequentialTest:
    """Paired log ratios of candidates over blocks; switches with a margin and a cooldown."""

    def __init__(self, candidates: tuple[float, ...], config: TwinConfig) -> None:
        self.candidates = candidates
        self.cfg = config
        self.logs: deque[np.ndarray] = deque(maxlen=config.memory)
        self.current = candidates.index(config.start_weight)
        self.since_switch = 0
        self.switches = 0
        self.decisions = 0

    @property
    def weight(self) -> float:
        return self.candidates[self.current]

    def add(self, imbalance: np.ndarray) -> float:
        """One block's imbalance under every candidate; returns the weight after deciding."""
        imbalance = np.asarray(imbalance, dtype=np.float64)
        if imbalance.shape != (len(self.candidates),) or not (imbalance > 0).all():
            return self.weight  # a block with nothing to balance says nothing
        self.logs.append(np.log(imbalance / imbalance[0]))
        self.since_switch += 1
        self.decisions += 1
        best = self.best()
        if best is not None:
            self.current = best
            self.since_switch = 0
            self.switches += 1
        return self.weight

    def bounds(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean and upper bound of every candidate's paired log ratio to the current weight."""
        n = len(self.logs)
        if n < 2:
            return None
        x = np.array(self.logs)
        d = x - x[:, [self.current]]
        m = d.mean(axis=0)
        # overlapping blocks share requests: widen the standard error by sqrt(overlap)
        se = d.std(axis=0, ddof=1) / math.sqrt(n) * math.sqrt(self.cfg.overlap)
        return m, m + self.cfg.z * se

    def best(self) -> int | None:
        """The candidate to switch to now, if any."""
        if len(self.logs) < self.cfg.min_windows or self.since_switch < self.cfg.cooldown:
            return None
        _, upper = self.bounds()
        upper[self.current] = np.inf
        j = int(np.argmin(upper))
        return j if upper[j] < -self.cfg.margin else None

    def versus_zero(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Mean and upper bound of every candidate's paired log ratio to ``w = 0``."""
        n = len(self.logs)
        if n < 2:
            return None
        x = np.array(self.logs)
        m = x.mean(axis=0)
        se = x.std(axis=0, ddof=1) / math.sqrt(n) * math.sqrt(self.cfg.overlap)
        return m, m + self.cfg.z * se

    def mean_log_ratios(self) -> list[float] | None:
        """Mean paired log ratio of every candidate to ``w = 0`` over the memory."""
        return None if not self.logs else np.array(self.logs).mean(axis=0).round(5).tolist()


class ShadowEstimator:
    """The twin's own copy of the live estimator: it learns a request only once the request
    has finished before the first arrival of the block being replayed (leakage-free)."""

    def __init__(self, estimator: CompletionEstimator | None) -> None:
        self.model = copy.deepcopy(estimator)
        self.learns = estimator is not None and estimator.learns_online
        self.heap: list[tuple[float, int, int, Finished]] = []
        self.seq = 0
        self.cutoff = -math.inf
        self.observed = 0

    def finished(self, done: Finished) -> None:
        """Completions to learn later, when a replayed block starts after them."""
        if not self.learns or done.index.size == 0:
            return
        for i in np.argsort(done.finish_s, kind="stable").tolist():
            heapq.heappush(self.heap, (float(done.finish_s[i]), self.seq, i, done))
            self.seq += 1

    def advance_to(self, t: float) -> None:
        """Learn every completion that finished strictly before ``t`` (in finish order)."""
        self.cutoff = max(self.cutoff, t)
        rows = []
        while self.heap and self.heap[0][0] < t:
            _, _, i, done = heapq.heappop(self.heap)
            rows.append(done.take(np.array([i])))
        if not rows:
            return
        b = Finished.concat(rows)
        self.model.observe(
            CompletedBatch(
                prompt_tokens=b.prompt_tokens,
                output_tokens=b.output_tokens,
                prompt_key=b.prompt_key,
                time_s=b.finish_s,
            )
        )
        self.observed += int(b.index.size)

    def snapshot(self) -> CompletionEstimator | None:
        """A copy the replay may teach (its own completions), leaving the shadow as it is."""
        return copy.deepcopy(self.model) if self.learns else self.model


def block_imbalance(result) -> tuple[float, float, int]:
    """Steady mean imbalance, whole-run mean imbalance and steady iterations of a replay."""
    imb = result.imbalance
    steady = result.waiting > 0
    n = int(steady.sum())
    s = float(imb[steady].mean()) if n else float("nan")
    return s, float(imb.mean()) if imb.size else float("nan"), n


def replay_candidate(
    group: TwinGroup,
    released: ReleasedRequests,
    w: float,
    estimator: CompletionEstimator | None,
) -> tuple[float, float, int, int]:
    """One candidate's replay of a block from an empty group: steady and whole-run mean
    imbalance, steady iterations and iterations (``estimator`` unused at ``w = 0``)."""
    options = {**group.router.options, "twin": False, "guard": False, "blend": w}
    spec = RouterSpec(group.router.router, group.router.estimator, options, label="twin")
    return replay_block(released, spec.build_policy(None if w == 0.0 else estimator), group)


def replay_block(
    released: ReleasedRequests, policy: Policy, group: TwinGroup
) -> tuple[float, float, int, int]:
    """``policy``'s replay of a block on ``group`` from an empty group: steady and whole-run
    mean imbalance, steady iterations and iterations (the twin's and the comparison's one replay)."""
    cfg = SimConfig(
        workers=group.workers,
        slots=group.slots,
        cost=group.cost,
        seed=group.seed,
        validate=False,
        record_loads=False,
    )
    result = simulate(released, policy, cfg)
    s, a, n = block_imbalance(result)
    return s, a, n, result.iterations


class DecodeTwin:
    """The library API: feed completions, run decision steps, read the weight.

    ``observe`` takes finished requests (any order); ``ready`` says whether the next block is
    complete; ``step`` replays it under every candidate and updates the weight, returning the
    simulated iterations it cost; ``weight`` is the blend weight to route with.
    """

    def __init__(
        self,
        group: TwinGroup,
        estimator: CompletionEstimator | None,
        config: TwinConfig | None = None,
        *,
        baseline: dict[int, tuple[float, float, int, int]] | None = None,
        warm: SequentialTest | None = None,
    ) -> None:
        self.cfg = config or TwinConfig()
        self.group = group
        self.size = self.cfg.block_size(group.workers, group.slots)
        self.shadow = ShadowEstimator(estimator)
        # a warm start continues the test a warm-up twin ran on earlier traffic
        self.test = (
            SequentialTest(tuple(self.cfg.candidates), self.cfg)
            if warm is None
            else copy.deepcopy(warm)
        )
        self.stride = max(1, self.size // self.cfg.overlap)
        self.parts: list[Finished] = []
        self.known = np.zeros(0, dtype=np.bool_)  # finished, by arrival index - known_from
        self.known_from = 0  # arrival index of known[0] (trim() drops the replayed prefix)
        self.next_block = 0
        self.iterations = 0  # simulated by the twin
        self.cpu_s = 0.0
        self.blocks_skipped = 0
        self.blocks_dropped = 0  # skipped over to keep up (budget)
        self.baseline = {} if baseline is None else baseline  # w = 0 replays, shareable

    @property
    def weight(self) -> float:
        return self.test.weight

    def observe(self, done: Finished) -> None:
        """Finished requests: kept for the blocks that hold them and for the shadow."""
        if done.index.size == 0:
            return
        self.shadow.finished(done)
        keep = done.index >= self.next_block * self.stride
        if not keep.any():
            return
        done = done.take(np.flatnonzero(keep))
        top = int(done.index.max()) + 1 - self.known_from
        if top > self.known.size:
            grown = np.zeros(max(top, 2 * self.known.size), dtype=np.bool_)
            grown[: self.known.size] = self.known
            self.known = grown
        self.known[done.index - self.known_from] = True
        self.parts.append(done)

    def _span(self, b: int) -> tuple[int, int]:
        return b * self.stride, b * self.stride + self.size

    def _ready(self, b: int) -> bool:
        lo, hi = (x - self.known_from for x in self._span(b))
        return hi <= self.known.size and bool(self.known[lo:hi].all())

    def complete_blocks(self) -> int:
        """Blocks complete and not yet replayed (the twin's lag, in blocks)."""
        n = 0
        while self._ready(self.next_block + n):
            n += 1
        return n

    def skip_behind(self, keep: int) -> int:
        """Skip the oldest complete blocks so that at most ``keep`` wait (a twin behind its
        budget decides on recent traffic); returns how many were skipped."""
        skipped = max(0, self.complete_blocks() - keep)
        self.next_block += skipped
        self.blocks_dropped += skipped
        return skipped

    def trim(self) -> None:
        """Forget what no later block needs: rows and flags before the next block's first
        arrival, and ``w = 0`` replays of earlier blocks (a live twin's memory stays bounded;
        the shared baseline of a schedule is left alone unless trimmed)."""
        start = self.next_block * self.stride
        if self.parts:
            rows = Finished.concat(self.parts)
            self.parts = [rows.take(np.flatnonzero(rows.index >= start))]
        cut = min(max(0, start - self.known_from), self.known.size)
        if cut:
            self.known = self.known[cut:].copy()
            self.known_from += cut
        for b in [b for b in self.baseline if b < self.next_block]:
            del self.baseline[b]

    def ready(self) -> bool:
        """Whether every request of the next block has finished."""
        return self._ready(self.next_block)

    def step(self, latest: bool = False) -> int:
        """Replay the next block under every candidate (if complete) and decide; returns the
        simulated iterations it took (0 when there was nothing to do). ``latest``: a twin
        behind its traffic (budget) skips to the newest complete block."""
        if not self.ready():
            return 0
        while latest and self._ready(self.next_block + 1):
            self.next_block += 1
            self.blocks_dropped += 1
        t0 = time.process_time()
        b = self.next_block
        lo, hi = self._span(b)
        rows = Finished.concat(self.parts)
        self.next_block += 1
        self.parts = [rows.take(np.flatnonzero(rows.index >= self.next_block * self.stride))]
        inside = rows.take(np.flatnonzero((rows.index >= lo) & (rows.index < hi)))
        _, first = np.unique(inside.index, return_index=True)  # sorted, one row per request
        block = inside.take(first)
        self.shadow.advance_to(float(block.release_s.min()))
        released = ReleasedRequests(
            release_s=block.release_s - block.release_s.min(),
            prompt_tokens=block.prompt_tokens.astype(np.int64),
            output_tokens=np.maximum(block.output_tokens.astype(np.int64), 1),
            table=RequestTable(
                prompt_tokens=block.prompt_tokens.astype(np.int64),
                prompt_key=block.prompt_key,
                trace_index=block.trace_index,
            ),
        )
        steady, whole, n_steady = [], [], []
        used = 0
        for w in self.cfg.candidates:
            if w == 0.0 and b in self.baseline:
                s, a, n, its = self.baseline[b]
            else:
                s, a, n, its = self._replay(released, w)
                if w == 0.0:
                    self.baseline[b] = (s, a, n, its)
                used += its
            steady.append(s)
            whole.append(a)
            n_steady.append(n)
        metric = steady if min(n_steady) >= MIN_STEADY else whole
        if not np.all(np.isfinite(metric)):
            self.blocks_skipped += 1
        else:
            self.test.add(np.array(metric))
        self.iterations += used
        self.cpu_s += time.process_time() - t0
        return max(used, 1)

    def _replay(self, released: ReleasedRequests, w: float) -> tuple[float, float, int, int]:
        """One candidate's replay of a block (:func:`replay_candidate`)."""
        return replay_candidate(
            self.group, released, w, None if w == 0.0 else self.shadow.snapshot()
        )

    def stats(self) -> dict[str, Any]:
        """The twin's state for a run summary or a service's metrics."""
        return {
            "twin_weight": self.weight,
            "twin_decisions": self.test.decisions,
            "twin_switches": self.test.switches,
            "twin_blocks_skipped": self.blocks_skipped,
            "twin_blocks_dropped": self.blocks_dropped,
            "twin_block_requests": self.size,
            "twin_block_stride": self.stride,
            "twin_iterations": self.iterations,
            "twin_cpu_s": round(self.cpu_s, 4),
            "twin_mean_log_ratios": self.test.mean_log_ratios(),
            "twin_candidates": list(self.cfg.candidates),
            "twin_shadow_observed": self.shadow.observed,
        }


class TwinDriver(Policy):
    """Runs a :class:`DecodeTwin` beside a BR-H policy in the simulator: completions feed the
    twin, its steps run in the untimed background hook under a budget of ``work_ratio``
    simulated iterations per live iteration, and its weight becomes the policy's blend."""

    def __init__(self, inner: Policy, twin: DecodeTwin, released: ReleasedRequests) -> None:
        self.inner = inner
        self.twin = twin
        self.released = released
        self.name = inner.name
        self.maximal = inner.maximal
        self.credit = 0.0
        self.last_iteration = 0
        self.weight_sum = 0.0
        self.calls = 0
        self.live_iterations = 0

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.inner.set_blend(self.twin.weight)

    def route(self, state: RouterState) -> Admissions:
        self.weight_sum += self.inner.blend
        self.calls += 1
        self.live_iterations = state.iteration
        return self.inner.route(state)

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.inner.on_complete(positions, output_tokens, finish_s, iteration)
        rq = self.released
        n = positions.shape[0]
        self.twin.observe(
            Finished(
                index=np.asarray(positions, dtype=np.int64),
                release_s=rq.release_s[positions],
                prompt_tokens=rq.table.prompt_tokens[positions],
                prompt_key=rq.table.prompt_key[positions],
                trace_index=rq.table.trace_index[positions],
                output_tokens=np.asarray(output_tokens, dtype=np.int64),
                finish_s=np.full(n, float(finish_s)),
            )
        )

    def background(self, iteration: int) -> None:
        self.credit += self.twin.cfg.work_ratio * max(0, iteration - self.last_iteration)
        self.last_iteration = max(self.last_iteration, iteration)
        while self.credit > 0 and self.twin.ready():
            self.credit -= self.twin.step(latest=True)
            self.inner.set_blend(self.twin.weight)

    def run_stats(self) -> dict[str, Any]:
        out = dict(self.inner.run_stats())
        out.update(self.twin.stats())
        out["twin_weight_mean"] = round(self.weight_sum / self.calls, 4) if self.calls else None
        return out

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def twin_managed(policy: Policy) -> bool:
    """Whether ``policy`` takes its blend weight from a twin."""
    return bool(getattr(policy, "twin_managed", False))


def attach_twin(
    policy: Policy,
    group: TwinGroup,
    released: ReleasedRequests,
    config: TwinConfig | None = None,
    warm: SequentialTest | None = None,
) -> Policy:
    """``policy`` driven by a live twin when it is twin-managed, else ``policy`` itself. The
    twin's estimator is a copy of the policy's, taken now (before any request arrived); a
    ``warm`` test (a warm-up on earlier traffic) is where its sequential test starts."""
    if not twin_managed(policy):
        return policy
    twin = DecodeTwin(group, policy.estimator, config, warm=warm)
    return TwinDriver(policy, twin, released)

"""Age from the clock: each rank's iteration clock estimated from the events, so the decider
knows every running request's age (tokens so far) without seeing a chunk.

A synchronized decode rank emits one token per running request per iteration, so a request's age
is 1 plus the iterations its rank ran since its first token. Each rank keeps an iteration count
integrated over time at its estimated iteration period (``count += dt / period``); a request's
count at its first token is remembered, and its age now is ``1 + count(now) - count(first)``.
The period is learned from finishes: a request that streamed ``n`` tokens between ``first_t`` and
``last_t`` saw iterations of ``(last_t - first_t) / (n - 1)`` on average (a moving average, per
rank, seeded by the group's); and its exact age at the end corrects the count's drift. Until the
first finish every running request's age stays 1 (as the first chunk says); a request that
began before its rank's period was known ages by the time since its first token.

Where the engine publishes its own step counter (vLLM's ``vllm:iteration_tokens_total``
histogram: one observation per engine step), the decider reads it every health interval
(:class:`EngineCounters`): two reads with requests running give the rank's period, which
replaces the finishes' average (the finishes still correct the count's drift); a counter that
moved since its last read counts as the rank heard, so a busy rank's health check is skipped.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

import numpy as np
from numba import njit

from balanceroute.features.stats import small_median
from balanceroute.serving.gateway.health import Fetch
from balanceroute.serving.gateway.state import LiveGroup

log = logging.getLogger("balanceroute.gateway")
STEPS = "vllm:iteration_tokens_total_count"
ALPHA = 0.2  # weight of the newest finish in the period's moving average
DRIFT_GAIN = 0.5  # share of a finish's age error the count absorbs
READ_TIMEOUT_S = 2.0  # one read of a rank's /metrics
CLUSTER_GAP_S = 0.002  # tokens closer than this (or a quarter step) came from one step
PHASE_ALPHA = 0.3  # weight of the newest gap in the step period's moving average
PHASE_SPAN = 8  # steps the phase is extrapolated over at most
LEARN_SPAN = 3  # a gap teaches the period only if it spans at most this many steps


class IterationClock:
    """Per-rank iteration counts integrated at estimated periods (module docstring)."""

    def __init__(self, ranks: int, now: float) -> None:
        self.period = np.full(ranks, np.nan)  # seconds per iteration; NaN: not known yet
        self.rate = np.zeros(ranks)  # iterations per second (1 / period; 0 while unknown)
        self.count = np.zeros(ranks)  # iterations counted so far
        self.upto = now  # when ``count`` was last brought up to date: a read before adds nothing
        self.group_period = float("nan")
        self.step = float("nan")  # the ranks' median period (the group's step), NaN: unknown
        self.finishes = 0
        # rank: (steps, t, busy) at the last read of its engine's step counter
        self.engine: dict[int, tuple[float, float, bool]] = {}

    def counts(self, now: float) -> np.ndarray:
        """Every rank's iteration count at ``now`` (brought up to date; two array operations:
        an arrival reads them before its decision)."""
        if now <= self.upto:  # a decision reads them several times at one instant
            return self.count
        self.count += self.rate * (now - self.upto)
        self.upto = now
        return self.count

    def set_periods(self, periods: np.ndarray | list[float] | float) -> None:
        """Every rank's period (NaN: unknown)."""
        self.period[:] = periods
        self._step()

    def observe(self, rank: int, count_at_first: float, first_t: float, last_t: float,
                tokens: int, now: float) -> None:  # fmt: skip
        """A request finished on ``rank`` with ``tokens`` tokens streamed over
        ``[first_t, last_t]`` (its count at the first token ``count_at_first``)."""
        if tokens < 2 or not last_t > first_t:
            return
        tpot = (last_t - first_t) / (tokens - 1)
        self.finishes += 1
        g = self.group_period
        self.group_period = tpot if np.isnan(g) else (1 - ALPHA) * g + ALPHA * tpot
        self.counts(now)
        unknown = np.isnan(self.period)
        self.period[unknown] = self.group_period  # a rank's first estimate: the group's
        if unknown[rank]:
            self.period[rank] = tpot
            self._step()
            return
        if rank not in self.engine:  # else the engine's own counter sets the period
            self.period[rank] = (1 - ALPHA) * self.period[rank] + ALPHA * tpot
        self._step()
        if np.isnan(count_at_first):  # it began before the rank's clock ran
            return
        counted = self.count[rank] - count_at_first
        elapsed_after = max(now - last_t, 0.0) / self.period[rank]
        self.count[rank] += DRIFT_GAIN * ((tokens - 1) + elapsed_after - counted)

    def engine_count(self, rank: int, steps: float, t: float, busy: bool) -> None:
        """The rank's own step counter read at ``t`` (vLLM's ``vllm:iteration_tokens_total``
        count; ``busy``: the rank had requests running): two reads while busy give the rank's
        period (an idle rank counts no steps), which then replaces the finishes' average."""
        self.counts(t)
        last = self.engine.get(rank)
        self.engine[rank] = (steps, t, busy)
        if last is not None and busy and last[2] and steps > last[0] and t > last[1]:
            self.period[rank] = (t - last[1]) / (steps - last[0])
            self._step()

    def _step(self) -> None:
        """The rates and the group's step, the median of the known periods, after a period
        changed (at every finish)."""
        self.rate = np.fmax(1.0 / self.period, 0.0)  # 0 where NaN
        known = self.period[~np.isnan(self.period)]
        self.step = small_median(known) if known.size else float("nan")

    def count_at(self, rank: int, t: float) -> float:
        """``rank``'s count at ``t`` (a first token's), NaN while its period is unknown."""
        if np.isnan(self.period[rank]):
            return float("nan")
        return float(self.counts(t)[rank])

    def ages(self, ranks: np.ndarray, count_at_first: np.ndarray, first_t: np.ndarray,
             now: float) -> np.ndarray:  # fmt: skip
        """Ages of requests running on ``ranks`` with first tokens at ``first_t`` (NaN: none
        yet, age 0) and the ranks' counts then (NaN: the clock did not run yet, so the age is
        the time since over the period)."""
        ages = np.zeros(ranks.shape[0], dtype=np.int64)
        prompts = np.zeros(ranks.shape[0], dtype=np.int64)
        aged_loads(ranks, prompts, count_at_first, first_t, self.counts(now), self.period, now,
                   ages, np.zeros(self.count.shape[0]))  # fmt: skip
        return ages


@njit(cache=True, nogil=True)
def aged_loads(rank, prompt, count_at_first, first_t, counts, period, now, age, loads):
    """For every position with a rank (``rank >= 0``): its age at ``now`` into ``age`` (1 plus
    the whole steps its rank counted since its first token, :meth:`IterationClock.ages`) and
    its prompt plus age added to its rank's ``loads``; one pass, no array built (a lone
    arrival's decision reads the loads)."""
    for p in range(rank.shape[0]):
        g = rank[p]
        if g < 0:
            continue
        if not np.isnan(count_at_first[p]):
            a = max(int(counts[g] - count_at_first[p]), 0) + 1
        elif np.isnan(first_t[p]):
            a = 0
        else:
            grown = 0.0 if np.isnan(period[g]) else (now - first_t[p]) / period[g]
            a = 1 + int(np.floor(max(grown, 0.0)))
        age[p] = a
        loads[g] += prompt[p] + a


class StepPhase:
    """When the group's next engine step ends, from the times its tokens reach the gateway.

    A synchronized group emits every running request's token at the end of each step, so the
    first tokens and last tokens the gateway hears come in clusters, one per step, a few
    milliseconds after the step ended. The start of the latest cluster and the step's period
    (the gap between clusters over the steps it spans, kept within a quarter of the period
    known otherwise: the engine's step counter, else the finishes' time per token) give the
    next cluster's time, which the step timing decides just before (:mod:`.timing`).
    """

    def __init__(self) -> None:
        self.period = float("nan")
        self.last = float("nan")  # the start of the latest cluster seen
        self.clusters = 0
        self.on_early: Callable[[float], None] | None = None  # how early a cluster came

    def observe(self, t: float) -> None:
        """A token reached the gateway at ``t``."""
        if np.isnan(self.last):
            self.last, self.clusters = t, 1
            return
        d = t - self.last
        gap = CLUSTER_GAP_S if np.isnan(self.period) else max(CLUSTER_GAP_S, 0.25 * self.period)
        if d < gap:  # the same step's (or an older one reported late)
            return
        if np.isnan(self.period):
            self.period = d  # provisional: the gap may span several steps
        else:
            steps = d / self.period
            n = round(steps)
            if self.on_early is not None and n >= 1:  # against the prediction
                self.on_early(self.last + n * self.period - t)
            if 1 <= n <= LEARN_SPAN and abs(steps - n) <= 0.25:  # the steps it spans are clear
                self.period += PHASE_ALPHA * (d / n - self.period)
            elif d < 0.75 * self.period:  # a gap well under the period: it was a multiple
                self.period = d
        self.last = t
        self.clusters += 1

    def seed(self, period: float) -> None:
        """The step period known otherwise (the engine's step counter, else the finishes' time
        per token): taken while none is measured or while the measured one is more than a
        quarter off it (a multiple of the step, or a step that grew while few tokens were
        heard); within that, the gaps between clusters refine it."""
        if period > 0 and (np.isnan(self.period) or not 0.8 < self.period / period < 1.25):
            self.period = period

    def next_after(self, t: float) -> float | None:
        """The first predicted cluster after ``t``; None while the phase is unknown or stale (no
        cluster for :data:`PHASE_SPAN` periods: the group idles or its pace changed)."""
        if np.isnan(self.period) or np.isnan(self.last) or self.period <= 0:
            return None
        steps = (t - self.last) / self.period
        if steps > PHASE_SPAN:
            return None
        return self.last + (np.floor(max(steps, 0.0)) + 1.0) * self.period


class ClockedGroup(LiveGroup):
    """The live group whose running requests age by their ranks' iteration clocks (first tokens
    and finishes are all it hears), and whose step counter is the group's clock."""

    clock_fn: Callable[[], float]

    def __post_init__(self) -> None:
        super().__post_init__()
        self.first_count = np.full(self.capacity, np.nan)
        self.first_t = np.full(self.capacity, np.nan)
        self.phase = StepPhase()
        self._on_early: Callable[[float], None] | None = None

    def attach(self, clock_fn: Callable[[], float]) -> None:
        """Start the ranks' clocks now (``clock_fn``: the gateway's monotonic clock)."""
        self.clock_fn = clock_fn
        self.clock = IterationClock(self.ranks, clock_fn())
        self.phase = StepPhase()
        self.phase.on_early = self._on_early
        self.loads()  # the kernel loaded (or compiled) now, not at the first decision

    def arrive(self, prompt_tokens: int, prompt_key: int, now: float) -> int | None:
        """As :meth:`LiveGroup.arrive`, its wait counted from the clocks' step count now (no
        decision may have read them since the group went quiet)."""
        self.pulse(now)
        return super().arrive(prompt_tokens, prompt_key, now)

    def first_token(self, position: int, t: float) -> None:
        """``position``'s first token arrived at ``t``: it has age 1 and ages with its rank."""
        g = int(self.rank[position])
        if g < 0 or not np.isnan(self.first_t[position]):
            return
        self.first_count[position] = self.clock.count_at(g, t)
        self.first_t[position] = t
        self.phase.seed(self.clock.step)
        self.phase.observe(t)
        self.age[position] = max(1, int(self.age[position]))
        self.heard[g] += 1

    def finish_seen(self, position: int, first_t: float, last_t: float, tokens: int) -> None:
        """``position`` finished with ``tokens`` tokens: its rank's clock learns from it."""
        g = int(self.rank[position])
        if g < 0:
            return
        if np.isnan(self.first_t[position]):
            self.first_token(position, first_t)
        self.clock.observe(g, float(self.first_count[position]), first_t, last_t, tokens,
                           self.clock_fn())  # fmt: skip
        self.phase.seed(self.clock.step)
        self.phase.observe(last_t)
        self.heard[g] += 1
        self.age[position] = tokens

    def start(self, position: int, rank: int) -> None:
        super().start(position, rank)
        self.first_count[position] = np.nan
        self.first_t[position] = np.nan

    def leave(self, position: int, output_tokens: int, *, learn: bool) -> None:
        self.first_count[position] = np.nan
        self.first_t[position] = np.nan
        super().leave(position, output_tokens, learn=learn)

    def loads(self, now: float | None = None) -> np.ndarray:
        """KV tokens per rank, every running request aged by its rank's clock at ``now`` (None:
        now; its age kept)."""
        now = self.clock_fn() if now is None else now
        loads = np.zeros(self.ranks)
        aged_loads(self.rank, self.table.prompt_tokens, self.first_count, self.first_t,
                   self.clock.counts(now), self.clock.period, now, self.age, loads)  # fmt: skip
        return loads

    def pulse(self, now: float) -> int:
        """The group's step count: the most advanced known rank clock's (one whose period is
        unknown counts 0, where the iteration starts); read once an instant (an arrival's
        decision pulses where its arrival did)."""
        same = now == self.now and self.tokens_seen == self._tokens_at_decision
        if same and now <= self.clock.upto:
            return self.iteration
        self.iteration = max(self.iteration, int(max(self.clock.counts(now).tolist())))
        return super().pulse(now)

    def next_step(self, after: float) -> float | None:
        """When the tokens of the first step ending after ``after`` should reach the gateway
        (:class:`StepPhase`), None while unknown."""
        return self.phase.next_after(after)

    def step_period(self) -> float:
        """The group's step period as its tokens' phase measures it (inf while unknown)."""
        period = self.phase.period
        return period if period > 0 else float("inf")

    def watch_step(self, on_early: Callable[[float], None]) -> None:
        """Tell ``on_early`` how early each step's tokens came against the phase's prediction."""
        self._on_early = self.phase.on_early = on_early

    def needs_tick(self) -> bool:
        """Never: the clocks count steps by time, whenever they are read."""
        return False


class EngineCounters:
    """Reads each rank's step counter from its ``/metrics`` every ``interval_s`` into the
    ranks' clocks; a rank whose engine does not publish it is read no more."""

    def __init__(self, group: ClockedGroup, header_mode: bool, interval_s: float) -> None:
        self.group = group
        self.header_mode = header_mode
        self.interval_s = interval_s
        self.absent: set[int] = set()

    def read(self, rank: int, text: str, t: float) -> bool:
        """One ``/metrics`` page of ``rank`` read at ``t``; False when it has no counter. A
        counter that moved since the last read is the engine stepping: the rank is heard, so
        the health round need not probe it (as a streamed token, :mod:`.health`)."""
        steps = engine_steps(text, rank if self.header_mode else None)
        if steps is None:
            return False
        last = self.group.clock.engine.get(rank)
        self.group.clock.engine_count(rank, steps, t, bool(self.group.inflight[rank] > 0))
        if last is not None and steps > last[0]:
            self.group.heard[rank] += 1
        return True

    def idle(self, rank: int) -> bool:
        """Whether ``rank`` runs nothing now: its counter is not read (an idle engine counts no
        steps, so a read gives no period); the last read no longer pairs with the next."""
        if self.group.inflight[rank] > 0:
            return False
        last = self.group.clock.engine.get(rank)
        if last is not None and last[2]:
            self.group.clock.engine[rank] = (last[0], last[1], False)
        return True

    async def run(self, fetch: Fetch) -> None:
        """Read the counter of every rank with requests running each interval until cancelled
        (through ``fetch``, the ranks' kept-alive connections), the ranks' reads at once: their
        answers wake the loop together, not one by one."""
        while True:
            ranks = [g for g in range(self.group.ranks) if g not in self.absent and not self.idle(g)]
            if ranks:
                await asyncio.gather(*(self._read_one(g, fetch) for g in ranks))
            await asyncio.sleep(self.interval_s)

    async def _read_one(self, g: int, fetch: Fetch) -> None:
        try:
            status, body = await fetch(g, "/metrics", {}, READ_TIMEOUT_S)
        except (OSError, TimeoutError):
            return  # health checks deal with a rank that does not answer
        text = body.decode("utf-8", "replace") if status == 200 else ""
        if not self.read(g, text, self.group.clock_fn()):
            log.info("rank %d publishes no step counter: its clock follows the finishes", g)
            self.absent.add(g)


def engine_steps(text: str, engine: int | None) -> float | None:
    """The step count in a ``/metrics`` page (``vllm:iteration_tokens_total_count``, summed over
    its series, or the series of ``engine``); None when the page has none."""
    total, found = 0.0, False
    want = None if engine is None else f'engine="{engine}"'
    for line in text.splitlines():
        if not line.startswith(STEPS):
            continue
        name, _, value = line.rpartition(" ")
        if want is not None and want not in name:
            continue
        total += float(value)
        found = True
    return total if found else None

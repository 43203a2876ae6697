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
import time
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.twin.config import MIN_STEADY, Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.replay import block_releases, replay_candidate
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.lab.twin.shadow import ShadowEstimator


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
        released = block_releases(block)
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

"""The twin's leakage-free copy of the live estimator (prequential, in finish order)."""

from __future__ import annotations

import copy
import heapq
import math

import numpy as np

from balanceroute.predict.base import CompletedBatch, CompletionEstimator
from balanceroute.router.lab.twin.config import Finished


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

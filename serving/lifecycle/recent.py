"""The recent completions a new model is taught before it serves (a ring buffer)."""

from __future__ import annotations

import numpy as np

from balanceroute.features.windows import ring_latest
from balanceroute.predict.base import CompletedBatch


class RecentCompletions:
    """Ring buffer of the last ``capacity`` completions, replayed into a model before its swap."""

    def __init__(self, capacity: int) -> None:
        self.capacity = cap = int(capacity)
        self.prompt = np.zeros(cap, dtype=np.int64)
        self.output = np.zeros(cap, dtype=np.int64)
        self.key = np.zeros(cap, dtype=np.uint64)
        self.time = np.zeros(cap, dtype=np.float64)
        self.total = 0  # completions ever added; the next one goes to slot total % capacity

    def __len__(self) -> int:
        return min(self.total, self.capacity)

    def add(self, batch: CompletedBatch) -> None:
        """Append a batch in order, overwriting the oldest rows beyond the capacity."""
        cap, n = self.capacity, batch.size
        if cap == 0 or n == 0:
            return
        keep = slice(max(n - cap, 0), n)
        keys = batch.prompt_key if batch.prompt_key is not None else np.zeros(n, dtype=np.uint64)
        times = batch.time_s if batch.time_s is not None else np.full(n, np.nan)
        at = (self.total + np.arange(max(n - cap, 0), n)) % cap
        self.prompt[at] = np.asarray(batch.prompt_tokens)[keep]
        self.output[at] = np.asarray(batch.output_tokens)[keep]
        self.key[at] = np.asarray(keys)[keep]
        self.time[at] = np.asarray(times)[keep]
        self.total += n

    def batch(self) -> CompletedBatch:
        """Everything kept, oldest first."""
        return self.since(0)

    def since(self, total: int) -> CompletedBatch:
        """The kept completions added after the first ``total``, oldest first."""
        n = min(len(self), max(self.total - total, 0))
        order = ring_latest(self.total, n, self.capacity)
        return CompletedBatch(
            self.prompt[order], self.output[order], self.key[order], self.time[order]
        )

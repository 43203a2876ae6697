"""What a routing policy sees: a snapshot of the decode tier at one admission step.

Everything is arrays. Requests are referred to by their *position* in the run's
:class:`RequestTable` (release order), so a policy never copies request records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


@dataclass(frozen=True, slots=True)
class RequestTable:
    """Known attributes of every request of a run, indexed by position (release order)."""

    prompt_tokens: np.ndarray  # int64 (N,)
    prompt_key: np.ndarray  # uint64 (N,), 0 = no key
    trace_index: np.ndarray  # int64 (N,), row of the replayed trace (oracle lookups)

    @property
    def size(self) -> int:
        return int(self.prompt_tokens.shape[0])


class Pool(Protocol):
    """The shared waiting pool, in release order (oldest first)."""

    size: int

    def head(self, n: int) -> np.ndarray:
        """Positions of the first ``n`` waiting requests (fewer if the pool is smaller)."""
        ...

    def waited_iterations(self, positions: np.ndarray) -> np.ndarray:
        """Iterations each request has waited since its release."""
        ...

    def waited_seconds(self, positions: np.ndarray) -> np.ndarray:
        """Seconds each request has waited since its release."""
        ...

    def overtaken(self, positions: np.ndarray) -> np.ndarray:
        """How many later-released requests were admitted while each one waited."""
        ...


@dataclass(frozen=True, slots=True)
class RunningRequests:
    """Requests in service; every array has one entry per running request."""

    position: np.ndarray  # int64 positions in the RequestTable
    worker: np.ndarray  # int64 worker index
    workload: np.ndarray  # int64 current KV tokens W_i(k) = S_i + age
    age: np.ndarray  # int64 tokens generated so far
    prompt_tokens: np.ndarray  # int64

    @property
    def size(self) -> int:
        return int(self.position.shape[0])


class RunningSource(Protocol):
    def __call__(self) -> RunningRequests: ...


class LoadsSource(Protocol):
    def __call__(self) -> np.ndarray: ...


@dataclass(slots=True)
class RouterState:
    """Snapshot at the start of an admission step (after completions, growth and releases)."""

    iteration: int
    time_s: float
    free_slots: np.ndarray  # int64 (G,)
    active: np.ndarray  # int64 (G,) running requests per worker
    pool: Pool
    requests: RequestTable
    running_source: RunningSource
    loads_source: LoadsSource
    free_total: int = -1  # ``free_slots.sum()`` where the builder keeps it (-1: summed here)
    _loads: np.ndarray | None = field(default=None, init=False, repr=False)
    _due: int = field(default=-1, init=False, repr=False)

    @property
    def loads(self) -> np.ndarray:
        """float64 (G,) KV tokens per worker before this step's admissions (built on first
        read: a live group ages every running request for them, which policies that count
        requests never need)."""
        if self._loads is None:
            self._loads = self.loads_source()
        return self._loads

    @property
    def workers(self) -> int:
        return int(self.free_slots.shape[0])

    @property
    def admissions_due(self) -> int:
        """``U_k = min(|pool|, free slots)``: how many requests a maximal policy admits now
        (counted once: a snapshot's pool and slots do not change)."""
        if self._due < 0:
            free = self.free_total if self.free_total >= 0 else int(self.free_slots.sum())
            self._due = min(self.pool.size, free)
        return self._due

    def running(self) -> RunningRequests:
        """The running requests (built on demand: most policies never need them)."""
        return self.running_source()


@dataclass(frozen=True, slots=True)
class Admissions:
    """A routing decision: request ``positions[j]`` goes to worker ``workers[j]``, in order."""

    positions: np.ndarray  # int64
    workers: np.ndarray  # int64

    @staticmethod
    def empty() -> Admissions:
        z = np.zeros(0, dtype=np.int64)
        return Admissions(z, z)

    @property
    def size(self) -> int:
        return int(self.positions.shape[0])


class ArrayPool:
    """A materialised pool (for one-off decisions, e.g. over HTTP): positions in order."""

    def __init__(
        self,
        positions: np.ndarray,
        waited_iterations: np.ndarray | None = None,
        waited_seconds: np.ndarray | None = None,
        overtaken: np.ndarray | None = None,
    ) -> None:
        self.positions = np.asarray(positions, dtype=np.int64)
        n = self.positions.shape[0]
        self.size = int(n)
        self._index = {int(p): j for j, p in enumerate(self.positions)}
        zeros = np.zeros(n, dtype=np.int64)
        self._wait_it = zeros if waited_iterations is None else np.asarray(waited_iterations)
        self._wait_s = (
            zeros.astype(np.float64) if waited_seconds is None else np.asarray(waited_seconds)
        )
        self._over = zeros if overtaken is None else np.asarray(overtaken)

    def head(self, n: int) -> np.ndarray:
        return self.positions[:n]

    def _rows(self, positions: np.ndarray) -> np.ndarray:
        return np.fromiter((self._index[int(p)] for p in positions), dtype=np.int64)

    def waited_iterations(self, positions: np.ndarray) -> np.ndarray:
        return self._wait_it[self._rows(positions)]

    def waited_seconds(self, positions: np.ndarray) -> np.ndarray:
        return self._wait_s[self._rows(positions)]

    def overtaken(self, positions: np.ndarray) -> np.ndarray:
        return self._over[self._rows(positions)]

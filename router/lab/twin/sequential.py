"""The twin's sequential test: paired log ratios over blocks, switching with a margin and a cooldown."""

from __future__ import annotations

import math
from collections import deque

import numpy as np

from balanceroute.router.lab.twin.config import TwinConfig


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

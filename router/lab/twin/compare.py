"""The twin's counterfactual A/B: every arm replayed on the same live traffic, paired by block.

A live switchback measures arms on different windows of time. The twin can replay *the same*
requests under every arm it can build in the simulator: each block of consecutive finished
arrivals (non-overlapping, the twin's block size) is replayed from an empty group once per arm
with the same releases and seed, each learned estimator a leakage-free shadow copy
(:class:`~.shadow.ShadowEstimator`: it learns only requests that finished before the block's first
arrival), a twin-driven arm at the weight its live twin routes with. The evidence is the log
ratio of each arm's steady imbalance to the reference arm's (the first); the summary gives the
geometric-mean ratio with a Student-t 95% interval over blocks.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.paired import ratio_interval
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.twin.config import MIN_STEADY, Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.replay import block_releases, replay_block
from balanceroute.router.lab.twin.shadow import ShadowEstimator
from balanceroute.router.policies.specs import RouterSpec

MEMORY = 256  # blocks the comparison keeps


@dataclass
class ComparedArm:
    """One arm the twin replays: its spec, its estimator (copied), and the live weight of a
    twin-driven arm (None: the arm as it is)."""

    label: str
    spec: RouterSpec
    estimator: CompletionEstimator | None = None
    weight: Callable[[], float] | None = None


class ArmComparison:
    """The counterfactual A/B of the arms on the fed traffic (a job of the twin worker)."""

    def __init__(
        self, arms: list[ComparedArm], group: TwinGroup, config: TwinConfig | None = None
    ) -> None:
        if len(arms) < 2:
            raise ValueError("a comparison needs at least two arms")
        cfg = config or TwinConfig()
        self.arms = arms
        self.group = group
        self.size = cfg.block_size(group.workers, group.slots)
        self.work_ratio = cfg.work_ratio
        self.credit = 0.0
        self.cpu_s = 0.0
        self.shadows = [ShadowEstimator(a.estimator) for a in arms]
        self.rows: list[Finished] = []
        self.count = 0  # rows held
        self.next_block = 0
        self.numbered = 0  # arrival numbers seen (dense)
        self.logs: deque[np.ndarray] = deque(maxlen=MEMORY)
        self.weights: deque[list[float | None]] = deque(maxlen=MEMORY)
        self.skipped = 0
        self.dropped = 0
        self.iterations = 0
        self._summary = self._make_summary()  # made by the worker, read by any thread

    def observe(self, rows: Finished) -> None:
        """Newly numbered finished requests (dense, in order); a comparison behind skips."""
        for s in self.shadows:
            s.finished(rows)
        self.numbered = max(self.numbered, int(rows.index.max()) + 1)
        self.rows.append(rows)
        self.count += int(rows.index.size)
        behind = (self.numbered - self.next_block * self.size) // self.size
        if behind > 2:
            self.next_block += behind - 2
            self.dropped += behind - 2
            self._trim()
            first = self.rows[0]  # the shadows learn up to the next block (bounded queues)
            hit = np.flatnonzero(first.index == self.next_block * self.size)
            if hit.size:
                for s in self.shadows:
                    s.advance_to(float(first.release_s[hit[0]]))

    def ready(self) -> bool:
        return self.numbered >= (self.next_block + 1) * self.size

    def _trim(self) -> None:
        rows = Finished.concat(self.rows)
        keep = rows.take(np.flatnonzero(rows.index >= self.next_block * self.size))
        self.rows, self.count = [keep], int(keep.index.size)

    def step(self) -> int:
        """Replay the next block under every arm; the simulated iterations."""
        if not self.ready():
            return 0
        lo = self.next_block * self.size
        rows = Finished.concat(self.rows)
        inside = rows.take(np.flatnonzero((rows.index >= lo) & (rows.index < lo + self.size)))
        _, first = np.unique(inside.index, return_index=True)
        block = inside.take(first)
        self.next_block += 1
        self._trim()
        released = block_releases(block)
        steady, whole, n_steady, weights, used = [], [], [], [], 0
        for arm, shadow in zip(self.arms, self.shadows, strict=True):
            shadow.advance_to(float(block.release_s.min()))
            w = None if arm.weight is None else float(arm.weight())
            s, a, n, its = self._replay(released, arm, shadow, w)
            steady.append(s)
            whole.append(a)
            n_steady.append(n)
            weights.append(w)
            used += its
        metric = np.array(steady if min(n_steady) >= MIN_STEADY else whole)
        if np.all(np.isfinite(metric)) and (metric > 0).all():
            self.logs.append(np.log(metric / metric[0]))
            self.weights.append(weights)
        else:
            self.skipped += 1
        self.iterations += used
        self._summary = self._make_summary()
        return max(used, 1)

    def _replay(
        self, released: ReleasedRequests, arm: ComparedArm, shadow: ShadowEstimator, w
    ) -> tuple[float, float, int, int]:
        spec = arm.spec
        options = dict(spec.options)
        if spec.estimator is not None:  # as the arm routes live: no guard, the twin's weight
            options.update({"twin": False, "guard": False})
            if w is not None:
                options["blend"] = w
        policy = RouterSpec(spec.router, spec.estimator, options, label=arm.label).build_policy(
            shadow.snapshot() if spec.estimator is not None else None
        )
        return replay_block(released, policy, self.group)

    def summary(self) -> dict[str, Any]:
        """Per arm: the paired ratio of its imbalance to the reference arm's, with interval
        (the worker's last snapshot: any thread may read it while the comparison steps)."""
        return {**self._summary, "blocks_dropped": self.dropped, "cpu_s": round(self.cpu_s, 4)}

    def _make_summary(self) -> dict[str, Any]:
        x = np.array(self.logs) if self.logs else np.zeros((0, len(self.arms)))
        reference = self.arms[0].label
        per_arm = {}
        for j, arm in enumerate(self.arms[1:], start=1):
            per_arm[arm.label] = ratio_interval(x[:, j])
            per_arm[arm.label]["weight_mean"] = _mean_weight([w[j] for w in self.weights])
        return {
            "reference": reference,
            "block_requests": self.size,
            "blocks": len(self.logs),
            "blocks_skipped": self.skipped,
            "blocks_dropped": self.dropped,
            "iterations": self.iterations,
            "cpu_s": round(self.cpu_s, 4),
            "imbalance_ratio_vs_reference": per_arm,
        }

    def stats(self) -> dict[str, Any]:
        return self.summary()


def _mean_weight(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return round(float(np.mean(kept)), 4) if kept else None

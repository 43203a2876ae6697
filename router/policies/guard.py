"""The do-no-harm guard of BR-H (docs/design.md, "The do-no-harm guard").

BR-H scores admissions against each worker's projected load. Without prediction every running
request is projected to survive: ``P0_g(h) = L_g + n_g h``; an estimator's projection ``P`` is
lower where it expects departures. The guard's weight ``w`` in ``{0, 1}`` chooses between them,
``P_w = P0 - w (P0 - P)``: with ``w = 0`` the router steps aside from the estimator and decides
exactly as ``brh:none`` does.

The weight is learned online, causally, from the completions the router sees, by judging
*decisions* on what happened, with no experiment on live traffic. Every ``stride`` iterations
the guard keeps a snapshot: ``P0``, the admissions the step made, and the admissions the same
step would have made with the other projection (one more compiled step, not applied). As the
snapshot's running requests finish, the guard adds the load their departures really took away,
``N`` (with the projection's refill rule), so ``P0 - N`` is what the running requests really
did. Once the horizon has passed, both decisions are scored on it by the quantity BR-H
minimises: the discounted imbalance ``sum_h gamma^h (G max_g L_{g,h} - sum_g L_{g,h})`` of
``P0 - N`` plus each decision's admissions (``b + h`` on their workers). Each snapshot gives the
relative difference ``d = (loss_with - loss_without) / loss_without``; their mean ``m`` and
standard error ``se`` are kept with exponential forgetting (memory of about ``memory``
snapshots). The estimator's projection is used only while ``m + se < 0``: while its decisions
are measurably better than the prediction-free ones over the effective horizon. Memory is
bounded: at most ``ceil((H + 1) / stride) + 1`` snapshots live at once, each holding ``P0``,
``N`` and at most ``G * B`` admissions per decision.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from numba import njit

MIN_SNAPSHOTS = 8  # scored snapshots before a verdict


@njit(cache=True, nogil=True)
def departures_into(k0, refill, live, taken, hs, workers, prompts, admitted, k):
    """Add the load that requests finishing at iteration ``k`` take away, as seen from every
    live snapshot that held them (``admitted < k0 < k``, ``k - k0 <= H``), into ``taken``.

    With a refill (``refill >= 0``) a departure at offset ``r`` takes away ``W + r - refill``
    for every ``h >= r`` (the slot holds a new request growing in step); without, ``W + h``.
    """
    horizon = taken.shape[2] - 1
    for j in range(k0.shape[0]):
        if not live[j]:
            continue
        r = k - k0[j]
        if r < 1 or r > horizon:
            continue
        for i in range(workers.shape[0]):
            x = admitted[i]
            if x >= k0[j]:
                continue
            g = workers[i]
            w0 = prompts[i] + (k0[j] - x)  # its workload at the snapshot
            if refill[j] >= 0.0:
                v = w0 + r - refill[j]
                for h in range(r, horizon + 1):
                    taken[j, g, h] += v
            else:
                for h in range(r, horizon + 1):
                    taken[j, g, h] += w0 + hs[h]


def decision_loss(
    loads: np.ndarray, workers: np.ndarray, prompts: np.ndarray, weights: np.ndarray
) -> float:
    """Discounted imbalance ``sum_h gamma^h (G max_g L - sum_g L)`` of ``loads`` ``(G, H+1)``
    after admitting ``prompts`` to ``workers`` (each ``b + h`` at offset ``h``)."""
    g_count, h1 = loads.shape
    after = loads.copy()
    np.add.at(after, workers, prompts[:, None] + np.arange(h1)[None, :])
    imbalance = g_count * after.max(axis=0) - after.sum(axis=0)
    return float(imbalance @ weights)


class ProjectionGuard:
    """Chooses, online, whether BR-H uses an estimator's projection or steps aside."""

    def __init__(
        self, workers: int, horizon: int, max_admissions: int, *, stride: int, memory: float
    ) -> None:
        self.horizon = horizon
        self.stride = stride
        self.forget = 1.0 - 1.0 / memory
        cap = -(-(horizon + 1) // stride) + 1
        h1 = horizon + 1
        self.k0 = np.zeros(cap, dtype=np.int64)
        self.refill = np.zeros(cap)
        self.live = np.zeros(cap, dtype=np.bool_)
        self.taken = np.zeros((cap, workers, h1))
        self.none = np.zeros((cap, workers, h1))
        self.weights = np.zeros((cap, h1))
        # admissions of each snapshot's two decisions: [j, 0] without, [j, 1] with the estimator
        self.dec_workers = np.zeros((cap, 2, max_admissions), dtype=np.int64)
        self.dec_prompts = np.zeros((cap, 2, max_admissions))
        self.dec_count = np.zeros((cap, 2), dtype=np.int64)
        self.hs = np.arange(h1, dtype=np.float64)
        self.moments = np.zeros(3)  # forgetting sums of 1, d, d^2 over scored snapshots
        self.scored = 0
        self.next_k: int | None = None
        self.weight = 0.0
        self.weight_sum = 0.0
        self.weight_calls = 0

    def due(self, k: int) -> bool:
        """Whether the step at iteration ``k`` should be kept as a snapshot."""
        return self.next_k is None or k >= self.next_k

    def record(
        self,
        k: int,
        none: np.ndarray,
        refill: float | None,
        weights: np.ndarray,
        without: tuple[np.ndarray, np.ndarray],
        with_estimator: tuple[np.ndarray, np.ndarray],
    ) -> None:
        """Keep the step at ``k``: ``P0`` and the two decisions, each ``(workers, prompts)``."""
        self._expire(k)
        free = np.flatnonzero(~self.live)
        if free.size == 0:  # cannot happen with the capacity above; never grow
            return
        j = int(free[0])
        self.k0[j] = k
        self.refill[j] = -1.0 if refill is None else float(refill)
        self.live[j] = True
        self.taken[j] = 0.0
        self.none[j] = none
        self.weights[j] = weights[: self.horizon + 1]
        for side, (ws, bs) in enumerate((without, with_estimator)):
            n = min(ws.shape[0], self.dec_workers.shape[2])
            self.dec_workers[j, side, :n] = ws[:n]
            self.dec_prompts[j, side, :n] = bs[:n]
            self.dec_count[j, side] = n
        self.next_k = k + self.stride

    def departed(
        self, k: int, workers: np.ndarray, prompts: np.ndarray, admitted: np.ndarray
    ) -> None:
        """Requests that left at the start of iteration ``k`` (worker, prompt, admission)."""
        if workers.size and self.live.any():
            departures_into(
                self.k0,
                self.refill,
                self.live,
                self.taken,
                self.hs,
                np.ascontiguousarray(workers, dtype=np.int64),
                np.ascontiguousarray(prompts, dtype=np.float64),
                np.ascontiguousarray(admitted, dtype=np.int64),
                int(k),
            )
        self._expire(k)

    def _expire(self, k: int) -> None:
        """Score the snapshots whose horizon has fully passed and update the weight."""
        done = np.flatnonzero(self.live & (self.k0 + self.horizon < k))
        for j in done[np.argsort(self.k0[done], kind="stable")].tolist():
            happened = self.none[j] - self.taken[j]
            without, with_estimator = (
                decision_loss(
                    happened,
                    self.dec_workers[j, side, : self.dec_count[j, side]],
                    self.dec_prompts[j, side, : self.dec_count[j, side]],
                    self.weights[j],
                )
                for side in (0, 1)
            )
            self.live[j] = False
            if without <= 0.0:
                continue
            d = (with_estimator - without) / without
            self.moments = self.forget * self.moments + np.array([1.0, d, d * d])
            self.scored += 1
        if done.size and self.scored >= MIN_SNAPSHOTS:
            n, s, s2 = self.moments
            m = s / n
            var = max(s2 / n - m * m, 0.0) * n / (n - 1) if n > 1 else math.inf
            self.weight = 1.0 if m + math.sqrt(var / n) < 0.0 else 0.0

    def use(self, none: np.ndarray, projected: np.ndarray) -> np.ndarray:
        """The projection the router scores against (a copy the step may update): the
        estimator's, or ``P0``."""
        self.weight_sum += self.weight
        self.weight_calls += 1
        return (projected if self.weight == 1.0 else none).copy()

    def stats(self) -> dict[str, Any]:
        """The guard's state for the run summary and the service's metrics."""
        n, s, _ = self.moments
        return {
            "guard_weight": self.weight,
            "guard_share_with_estimator": round(self.weight_sum / self.weight_calls, 4)
            if self.weight_calls
            else None,
            "guard_snapshots": self.scored,
            # mean relative change of the decisions' discounted imbalance with the estimator
            "guard_decision_change": round(s / n, 5) if n > 0 else None,
        }

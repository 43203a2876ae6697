"""The do-no-harm guard of BR-H (docs/design.md, "The do-no-harm guard").

BR-H scores admissions against each worker's projected load. Without prediction every running
request is projected to survive: ``P0_g(h) = L_g + n_g h``. An estimator's projection is
``P_g(h) = P0_g(h) - D_g(h)``, where ``D`` is the load its predicted departures take away (net
of the refill); a weight ``w`` in ``[0, 1]`` shrinks it toward the prediction-free one:
``P_w = P0 - w D`` (the same as shrinking every survival curve, ``S_w = 1 - w (1 - S)``, since
the projection is linear in the curves).

The weight is chosen online, causally, from the completions the router sees. Every ``stride``
iterations the guard keeps a snapshot of ``P0`` and ``D`` (``G x (H+1)`` each) and of a few
typical waiting prompts; as the snapshot's running requests finish, it adds the load their
departures really took away, ``N`` (same refill rule), so ``P0 - N`` is what happened. ``H``
iterations later the snapshot is scored *as the router uses it*: for each typical prompt ``b``
the score ``F_g(b)`` of placing it on each worker (``router.scoring.horizon_score`` against
that worker's projected margins), centred over the workers (only the ranking of workers
matters to a decision), is compared with the score the realised loads give; the loss of each
weight on a grid ``WEIGHTS`` accumulates with exponential forgetting (memory of about
``memory`` snapshots, at most ``ceil((H + 1) / stride) + 1`` snapshots live at once). The guard
uses the weight with the least loss, but only where it beats no prediction (``w = 0``) by
``MATERIAL``: an estimator that does not measurably improve the decisions steps aside.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

MIN_SNAPSHOTS = 4  # scored snapshots before the learned weight replaces the starting one
WEIGHTS = np.array([0.0, 1.0])  # the weights the guard chooses among
MATERIAL = 0.02  # share of no prediction's loss a weight must save to be used
PROBES = (0.25, 0.5, 0.75)  # quantiles of the waiting prompts whose placement is scored


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


def centred_scores(
    loads: np.ndarray, probes: np.ndarray, weights: np.ndarray, beta: float
) -> np.ndarray:
    """``(len(probes), G)``: BR-H's score of placing each probe prompt on each worker against
    projected ``loads`` ``(G, H+1)`` (``F^H`` with margins to the maximum), minus the mean over
    workers."""
    margins = loads.max(axis=0, keepdims=True) - loads
    over = np.maximum(probes[:, None, None] - margins[None, :, :], 0.0)
    score = weights.sum() * probes[:, None] - beta * (over * weights).sum(axis=2)
    return score - score.mean(axis=1, keepdims=True)


def weight_losses(
    none: np.ndarray,
    predicted: np.ndarray,
    taken: np.ndarray,
    probes: np.ndarray,
    weights: np.ndarray,
    beta: float,
) -> np.ndarray:
    """Loss of each weight of ``WEIGHTS`` on one snapshot: squared error of the centred scores
    of ``P0 - w D`` against those of the realised ``P0 - N``, each probe scaled by its size."""
    truth = centred_scores(none - taken, probes, weights, beta)
    scale = (probes * weights.sum()) ** 2
    out = np.empty(WEIGHTS.shape[0])
    for j, w in enumerate(WEIGHTS.tolist()):
        err = centred_scores(none - w * predicted, probes, weights, beta) - truth
        out[j] = float(((err * err).sum(axis=1) / scale).sum())
    return out


class ProjectionGuard:
    """Learns the weight ``w`` that shrinks an estimator's projection toward no prediction."""

    def __init__(
        self,
        workers: int,
        horizon: int,
        *,
        stride: int,
        memory: float,
        start: float,
        beta: float,
    ) -> None:
        self.workers = workers
        self.beta = beta
        self.horizon = horizon
        self.stride = stride
        self.forget = 1.0 - 1.0 / memory
        self.start = start
        cap = -(-(horizon + 1) // stride) + 1
        self.k0 = np.zeros(cap, dtype=np.int64)
        self.refill = np.zeros(cap)
        self.live = np.zeros(cap, dtype=np.bool_)
        self.taken = np.zeros((cap, workers, horizon + 1))
        self.predicted = np.zeros((cap, workers, horizon + 1))
        self.none = np.zeros((cap, workers, horizon + 1))
        self.probes = np.zeros((cap, len(PROBES)))
        self.weights = np.zeros((cap, horizon + 1))
        self.hs = np.arange(horizon + 1, dtype=np.float64)
        self.losses = np.zeros(WEIGHTS.shape[0])  # per weight, with forgetting
        self.raw_losses = np.zeros(WEIGHTS.shape[0])  # the same without, for the run summary
        self.scored = 0
        self.next_k: int | None = None
        self.weight = start
        self.weight_sum = 0.0
        self.weight_calls = 0

    def due(self, k: int) -> bool:
        """Whether the projection at iteration ``k`` should be kept as a snapshot."""
        return self.next_k is None or k >= self.next_k

    def record(
        self,
        k: int,
        none: np.ndarray,
        predicted: np.ndarray,
        waiting: np.ndarray,
        refill: float | None,
        weights: np.ndarray,
    ) -> None:
        """Keep ``P0`` and ``D`` (``G x (H+1)``: the load the estimator's departures take away)
        at ``k``, with the waiting prompts' quartiles as probes."""
        self._expire(k)
        if waiting.size == 0:
            return
        free = np.flatnonzero(~self.live)
        if free.size == 0:  # cannot happen with the capacity above; never grow
            return
        j = int(free[0])
        self.k0[j] = k
        self.refill[j] = -1.0 if refill is None else float(refill)
        self.live[j] = True
        self.taken[j] = 0.0
        self.predicted[j] = predicted
        self.none[j] = none
        self.probes[j] = np.quantile(waiting, PROBES)
        self.weights[j] = weights[: self.horizon + 1]
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
            loss = weight_losses(
                self.none[j],
                self.predicted[j],
                self.taken[j],
                self.probes[j],
                self.weights[j],
                self.beta,
            )
            self.losses = self.forget * self.losses + loss
            self.raw_losses += loss
            self.scored += 1
            self.live[j] = False
        if done.size and self.scored >= MIN_SNAPSHOTS:
            best = int(np.argmin(self.losses))
            material = self.losses[best] < (1.0 - MATERIAL) * self.losses[0]
            self.weight = float(WEIGHTS[best]) if material else 0.0

    def shrink(self, none: np.ndarray, projected: np.ndarray) -> np.ndarray:
        """The projection the router scores against: ``P0 - w (P0 - P)``."""
        self.weight_sum += self.weight
        self.weight_calls += 1
        if self.weight == 1.0:
            return projected
        return none - self.weight * (none - projected)

    def stats(self) -> dict[str, Any]:
        """The guard's state for the run summary and the service's metrics."""
        mean = self.weight_sum / self.weight_calls if self.weight_calls else self.weight
        base = float(self.raw_losses[0])
        return {
            "guard_weight": round(self.weight, 4),
            "guard_weight_mean": round(mean, 4),
            "guard_snapshots": self.scored,
            # the decisions' score error with the estimator's projection, relative to none's
            "guard_loss_estimator": round(float(self.raw_losses[-1]) / base, 4)
            if base > 0
            else None,
        }

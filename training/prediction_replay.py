"""Prequential replay: predict test snapshots the way the router does, observing completions first.

The estimator was fitted on the training requests. Test snapshots are visited in time order; before
each step the estimator ``observe()``-s every test request that finished strictly before it (in
finish order, with the timing model of :class:`balanceroute.features.causal.CausalConfig`), so every prediction
uses only what was knowable then. Snapshots with no completion between them share one ``predict``
call (and, when curves are asked for, one more with ``survival=True``); when there are more such groups than ``max_steps``, consecutive groups are merged and use the
state at the group's first snapshot (still causal, only a little stale).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from balanceroute.features.causal import CausalConfig
from balanceroute.features.schema import TraceArrays
from balanceroute.predict.base import CompletedBatch, CompletionEstimator, RunningBatch


@dataclass(frozen=True, slots=True)
class ReplayResult:
    """Predictions aligned with the snapshots given to :func:`replay_predict`."""

    p_finish: np.ndarray
    c: np.ndarray
    steps: int
    seconds: float
    survival: np.ndarray | None = None  # (n, H+1) curves when asked for


def _step_starts(n_done: np.ndarray, max_steps: int) -> np.ndarray:
    """Start offsets (into time-sorted snapshots) of the predict steps."""
    starts = np.flatnonzero(np.r_[True, n_done[1:] != n_done[:-1]])
    if starts.size > max_steps:
        starts = starts[np.unique(np.linspace(0, starts.size - 1, max_steps).astype(np.int64))]
    return starts


def replay_predictions(
    estimator: CompletionEstimator,
    trace: TraceArrays,
    first_test: int,
    index: np.ndarray,
    age: np.ndarray,
    cfg: CausalConfig | None = None,
    max_steps: int = 4000,
    survival: bool = False,
) -> ReplayResult:
    """Predict snapshots ``(index, age)`` of ``trace`` while observing test completions in order
    (with ``survival``, also each snapshot's survival curve)."""
    cfg = cfg or CausalConfig()
    t0 = time.perf_counter()
    finish = cfg.finish_times(trace)
    test = np.arange(first_test, trace.size)
    done_order = test[np.argsort(finish[test], kind="stable")]
    done_times = finish[done_order]
    t_snap = cfg.snapshot_times(trace, index, age)
    order = np.argsort(t_snap, kind="stable")
    n_done = np.searchsorted(done_times, t_snap[order], side="left")
    starts = _step_starts(n_done, max_steps)
    ends = np.r_[starts[1:], order.size]
    p = np.empty(order.size)
    c = np.empty(order.size)
    curves = np.empty((order.size, estimator.horizon + 1)) if survival else None
    seen = 0
    for s, e in zip(starts, ends, strict=True):
        upto = int(n_done[s])
        if upto > seen:
            sel = done_order[seen:upto]
            estimator.observe(
                CompletedBatch(
                    trace.prompt_tokens[sel],
                    trace.output_tokens[sel],
                    trace.prompt_key[sel],
                    done_times[seen:upto],
                )
            )
            seen = upto
        rows = order[s:e]
        batch = RunningBatch(
            prompt_tokens=trace.prompt_tokens[index[rows]],
            age=age[rows],
            prompt_key=trace.prompt_key[index[rows]],
            request_index=index[rows],
            time_s=float(t_snap[rows[0]]),
        )
        pred = estimator.predict(batch)
        p[rows], c[rows] = pred.p_finish, pred.c
        if curves is not None:  # a second call: the point answers stay those of a plain call
            curves[rows] = estimator.predict(batch, survival=True).survival
    return ReplayResult(p, c, int(starts.size), time.perf_counter() - t0, curves)


def predictions_per_second(
    estimator: CompletionEstimator,
    trace: TraceArrays,
    index: np.ndarray,
    age: np.ndarray,
    batch: int = 4096,
    repeats: int = 5,
) -> float:
    """Throughput of ``predict`` on a batch of ``batch`` snapshots (best of ``repeats``)."""
    take = np.resize(np.arange(index.size), batch)
    rb = RunningBatch(
        prompt_tokens=trace.prompt_tokens[index[take]],
        age=age[take],
        prompt_key=trace.prompt_key[index[take]],
        request_index=index[take],
        time_s=None,
    )
    estimator.predict(rb)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        estimator.predict(rb)
        best = min(best, time.perf_counter() - t0)
    return batch / max(best, 1e-9)

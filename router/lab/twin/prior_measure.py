"""The twin's prior measured at train time: paired windows of cross-fitted folds under every candidate, judged against w = 0."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.paired import paired_ratio
from balanceroute.router.lab.prefill import PrefillConfig, ReleasedRequests
from balanceroute.router.lab.replay_spec import ReplaySpec, released_requests
from balanceroute.router.lab.twin.config import MIN_STEADY, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.prior import PRIOR_LEVEL, PriorConfig, TwinPrior
from balanceroute.router.lab.twin.replay import replay_candidate
from balanceroute.router.lab.twin.schedule import finished_all
from balanceroute.router.lab.twin.shadow import ShadowEstimator
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import RequestTable


def window_requests(released: ReleasedRequests, lo: int, hi: int) -> ReleasedRequests:
    """Requests ``lo..hi-1`` (release order) as a replay from an empty group at time 0."""
    sel = slice(lo, hi)
    t = released.table
    return ReleasedRequests(
        release_s=released.release_s[sel] - released.release_s[lo],
        prompt_tokens=released.prompt_tokens[sel],
        output_tokens=np.maximum(released.output_tokens[sel], 1),
        table=RequestTable(t.prompt_tokens[sel], t.prompt_key[sel], t.trace_index[sel]),
    )


def prior_spec(cfg: PriorConfig, horizon: int) -> ReplaySpec:
    """The replay the prior is measured on: default ``brh`` looking ``horizon`` ahead."""
    return ReplaySpec(
        router=RouterSpec.parse(f"brh{{horizon={int(horizon)}}}"),
        workers=cfg.workers,
        slots=cfg.slots,
        prefill=PrefillConfig(saturate=cfg.load is None),
        load=cfg.load,
    )


def measure_prior(
    estimator: CompletionEstimator,
    holdout: pd.DataFrame,
    cfg: PriorConfig | None = None,
    twin: TwinConfig | None = None,
    baseline: dict[tuple, tuple[float, float, int, int]] | None = None,
) -> TwinPrior:
    """The twin's paired test of ``estimator`` on ``holdout`` (requests it never saw): each
    candidate weight against ``w = 0`` over ``cfg.windows`` evenly spaced windows of the twin's
    block length. ``baseline`` shares the ``w = 0`` replays between estimators."""
    return measure_folds([(estimator, holdout)], cfg, twin, baseline)


@dataclass
class FoldWindows:
    """One fold's paired windows: imbalance per window (rows) and candidate (columns)."""

    metric: np.ndarray
    requests: int


def measure_folds(
    folds: list[tuple[CompletionEstimator, pd.DataFrame]],
    cfg: PriorConfig | None = None,
    twin: TwinConfig | None = None,
    baseline: dict[tuple, tuple[float, float, int, int]] | None = None,
) -> TwinPrior:
    """The twin's paired test pooled over cross-fitted folds: each ``(estimator, requests)``
    pair is a copy fitted without those requests and the requests it replays. ``cfg.windows``
    windows in all, shared evenly between the folds (at least 2 each); the overlap is counted
    per fold (a fold's windows cover only that fold), so the pooled standard error is the
    per-window spread over the independent windows of every fold together."""
    cfg = cfg or PriorConfig()
    twin = twin or TwinConfig()
    baseline = {} if baseline is None else baseline
    k = len(twin.candidates)
    size = twin.block_size(cfg.workers, cfg.slots)
    per_fold = max(2, math.ceil(cfg.windows / max(1, len(folds))))
    if not folds:
        raise ValueError("measure_folds needs at least one fold")
    parts = [
        fold_windows(est, frame, cfg, twin, baseline, per_fold, tag=j)
        for j, (est, frame) in enumerate(folds)
    ]
    arrivals = np.concatenate([f["arrival_s"].to_numpy(dtype=np.float64) for _, f in folds])
    n = int(sum(p.requests for p in parts))
    common = {
        "candidates": tuple(twin.candidates),
        "block_requests": size,
        "workers": cfg.workers,
        "slots": cfg.slots,
        "load": cfg.load,
        "holdout_requests": n,
        "holdout_first_arrival_s": float(arrivals.min()) if arrivals.size else 0.0,
        "holdout_last_arrival_s": float(arrivals.max()) if arrivals.size else 0.0,
        "folds": len(folds),
    }
    used = [p for p in parts if p.metric.shape[0]]
    if not used:
        largest = max((p.requests for p in parts), default=0)
        return TwinPrior(
            start_weight=0.0,
            mean_log_ratio=(0.0,) * k,
            se=(0.0,) * k,
            upper=(1.0,) * k,
            windows=0,
            overlap=0.0,
            note=f"{_short(len(parts), largest)} fewer than one block of {size}: no evidence",
            **common,
        )
    metric = np.vstack([p.metric for p in used])
    windows = metric.shape[0]
    # a fold's windows cover that fold only: the overlap is theirs over the folds they cover
    overlap = windows * size / sum(p.requests for p in used)
    skipped = len(parts) - len(used)
    note = f"{skipped} fold(s) shorter than a block of {size} gave no windows" if skipped else ""
    return replace(judged(metric, twin, overlap, windows, common), note=note)


def _short(folds: int, largest: int) -> str:
    """Whose requests fell short of a block: the holdout's (one fold) or each fold's."""
    if folds == 1:
        return f"the holdout's {largest} requests are"
    return f"each of the {folds} cross-fitted folds holds at most {largest} requests,"


def spaced_windows(requests: int, size: int, overlap: int) -> int:
    """Windows of ``size`` over ``requests`` that cover them about ``overlap`` times (the live
    twin's own spacing, a block every ``size / overlap`` arrivals), at least 2.

    More windows than that add replays, not evidence: the paired interval widens its standard
    error by the square root of the coverage, so over ``n`` requests it is about the per-window
    spread times ``sqrt(size / n)`` however many windows overlap (measured on the pipeline's
    judge slice: benchmarks/studies/prior_windows.py, docs/results.md)."""
    return max(2, round(overlap * requests / size))


def fold_windows(
    estimator: CompletionEstimator,
    holdout: pd.DataFrame,
    cfg: PriorConfig,
    twin: TwinConfig,
    baseline: dict[tuple, tuple[float, float, int, int]],
    windows: int,
    tag: int = 0,
) -> FoldWindows:
    """``windows`` evenly spaced windows of one fold (``holdout``, requests ``estimator`` never
    saw) replayed under every candidate, paired, at most :func:`spaced_windows` of them; none
    when the fold is shorter than a block. ``tag`` tells the folds apart in the shared
    ``w = 0`` replays."""
    spec = prior_spec(cfg, estimator.horizon)
    frame = holdout.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    first = float(frame["arrival_s"].iloc[0]) if len(frame) else 0.0
    if len(frame):
        frame["arrival_s"] = frame["arrival_s"] - first
    released, _ = released_requests(frame, spec)
    group = TwinGroup(spec.router, cfg.workers, cfg.slots, spec.cost, spec.seed)
    size = twin.block_size(cfg.workers, cfg.slots)
    n = released.size
    k = len(twin.candidates)
    if n < size:
        return FoldWindows(np.zeros((0, k)), n)
    windows = min(windows, spaced_windows(n, size, twin.overlap))
    starts = np.unique(np.round(np.linspace(0, n - size, windows)).astype(int)).tolist()
    shadow = ShadowEstimator(estimator)
    shadow.finished(finished_all(released, size))
    metric = np.full((len(starts), k), np.nan)
    for i, lo in enumerate(starts):
        block = window_requests(released, lo, lo + size)
        shadow.advance_to(float(released.release_s[lo]))
        runs = []
        for w in twin.candidates:
            key = (cfg.workers, cfg.slots, cfg.load, estimator.horizon, tag, first, n, size, lo)
            if w == 0.0 and key in baseline:
                runs.append(baseline[key])
                continue
            run = replay_candidate(group, block, w, None if w == 0.0 else shadow.snapshot())
            if w == 0.0:
                baseline[key] = run
            runs.append(run)
        steady = min(r[2] for r in runs) >= MIN_STEADY
        metric[i] = [r[0] if steady else r[1] for r in runs]
    return FoldWindows(metric, n)


def judged(
    metric: np.ndarray, twin: TwinConfig, overlap: float, windows: int, common: dict[str, Any]
) -> TwinPrior:
    """The prior from per-window imbalance under every candidate (columns; ``w = 0`` first in
    ``twin.candidates``' order): among the candidates whose upper bound is below
    ``exp(-margin)`` (resolved better than ``w = 0``), the one with the largest mean gain; none
    resolved: ``w = 0``. Every move is as safe as the bar; among safe moves, the one worth most
    (the lowest upper bound would prefer a smaller, less noisy gain)."""
    zero = twin.candidates.index(0.0)
    means, ses, uppers = [], [], []
    for j in range(metric.shape[1]):
        pr = paired_ratio(metric[:, j], metric[:, zero], overlap=overlap, level=PRIOR_LEVEL)
        if j == zero:
            means.append(0.0)
            ses.append(0.0)
            uppers.append(1.0)
            continue
        if pr is None:  # fewer than two windows: no evidence, no move
            means.append(0.0)
            ses.append(0.0)
            uppers.append(1.0)
            continue
        ok = np.isfinite(metric[:, j]) & np.isfinite(metric[:, zero])
        logs = np.log(metric[ok, j] / metric[ok, zero])
        se = float(logs.std(ddof=1)) / math.sqrt(logs.size) * math.sqrt(max(1.0, overlap))
        means.append(round(float(logs.mean()), 6))
        ses.append(round(se, 6))
        uppers.append(round(pr.high, 6))
    resolved = [j for j in range(len(uppers)) if j != zero and uppers[j] < math.exp(-twin.margin)]
    best = min(resolved, key=lambda j: (means[j], uppers[j]), default=zero)
    start = twin.candidates[best]
    return TwinPrior(
        start_weight=float(start),
        mean_log_ratio=tuple(means),
        se=tuple(ses),
        upper=tuple(uppers),
        windows=windows,
        overlap=round(overlap, 4),
        **common,
    )


def priors_for(
    folds: dict[str, list[tuple[CompletionEstimator, pd.DataFrame]]],
    configs: list[PriorConfig],
    twin: TwinConfig | None = None,
    progress=None,
) -> dict[str, list[TwinPrior]]:
    """Every estimator's priors, one per group config, each pooled over that estimator's folds
    (``(copy fitted without the requests, the requests)`` pairs; ``w = 0`` replays shared)."""
    baseline: dict = {}
    out: dict[str, list[TwinPrior]] = {}
    for kind, pairs in folds.items():
        out[kind] = []
        for cfg in configs:
            copies = [(copy.deepcopy(est), frame) for est, frame in pairs]
            prior = measure_folds(copies, cfg, twin, baseline)
            out[kind].append(prior)
            if progress:
                progress(
                    f"twin prior of {kind} ({prior.group}, {prior.windows} windows of "
                    f"{prior.folds} fold(s), {prior.holdout_requests:,} requests): start at "
                    f"w = {prior.start_weight:g}, upper bounds {list(prior.upper)} "
                    f"{prior.note}".rstrip()
                )
    return out

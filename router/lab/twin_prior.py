"""The twin's prior: its paired test run at ``train`` time on requests the model never saw, kept
with the model.

A registered model's twin has no history it did not see, so it would start at ``w = 0`` and
need about 7,000 finished requests before its first switch (docs/design.md, "The twin"). At
``train`` time there is such history: replayed by copies of the estimator fitted without it.
:func:`measure_folds` pools cross-fitted folds (``training/crossfit.py``: each fold of the
trace replayed by a copy fitted on the other folds; :func:`measure_prior` is one such fold):
many overlapping windows of the twin's block length (``8 G B`` requests) per fold under each
candidate, paired (same releases, same ``w = 0`` replay), every candidate judged against
``w = 0`` with the A/B's paired interval (``router/lab/paired.py``: a t-interval on the log
ratios widened by ``sqrt(overlap)``, the overlap counted per fold), at the twin's own
one-sided level (``z = 2``) and margin. A copy in the replays learns online only from its
fold's requests finished before the window it replays (the twin's :class:`ShadowEstimator`):
leakage-free, causal.

The verdict travels with the model: a list of plain dicts (one per group shape measured) in the
estimator's ``twin_prior_`` attribute (so the joblib file, the registered version and a service
that loads either all carry it), and, for people, an MLflow artifact and version tags.
A consumer whose group has a measured shape (G and B) starts its twin's sequential test at the
prior's weight (:func:`prior_start`); the online test continues from there and can switch away,
back to ``w = 0``, on its own evidence. Any other shape, or a prior that does not parse: the twin
starts at ``w = 0`` as before, and the run says why.
"""

from __future__ import annotations

import copy
import logging
import math
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.model_store import load_estimator
from balanceroute.router.lab.paired import paired_ratio
from balanceroute.router.lab.prefill import PrefillConfig, ReleasedRequests
from balanceroute.router.lab.replay_spec import ReplaySpec, released_requests
from balanceroute.router.lab.twin import (
    MIN_STEADY,
    SequentialTest,
    ShadowEstimator,
    TwinConfig,
    TwinGroup,
    replay_candidate,
)
from balanceroute.router.lab.twin_schedule import finished_all
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import RequestTable

PRIOR_ATTRIBUTE = "twin_prior_"
PRIOR_VERSION = 1
# the twin's one-sided bound m + 2 se as a two-sided level: 2 Phi(2) - 1
PRIOR_LEVEL = math.erf(2.0 / math.sqrt(2.0))
DEFAULT_PRIOR_WINDOWS = 16


@dataclass(frozen=True)
class PriorConfig:
    """Where the prior is measured: the group shape and load, and how many windows."""

    workers: int = 8
    slots: int = 32
    load: float | None = None  # offered load (x capacity); None: saturated
    windows: int = DEFAULT_PRIOR_WINDOWS

    def __post_init__(self) -> None:
        if self.workers < 1 or self.slots < 1:
            raise UserError(f"twin prior: need G, B >= 1, got {self.workers}x{self.slots}")
        if self.load is not None and not self.load > 0:
            raise UserError(f"twin prior: load must be > 0, got {self.load}")
        if self.windows < 2:
            raise UserError(f"twin prior: need at least 2 windows, got {self.windows}")


@dataclass(frozen=True)
class TwinPrior:
    """The twin's verdict on a model from its holdout: the weight to start at, the evidence
    (per candidate: mean paired log ratio to ``w = 0``, its standard error widened by
    ``sqrt(overlap)``, the upper end of the ratio's interval) and what it was measured on."""

    start_weight: float
    candidates: tuple[float, ...]
    mean_log_ratio: tuple[float, ...]
    se: tuple[float, ...]
    upper: tuple[float, ...]
    windows: int
    overlap: float
    block_requests: int
    workers: int
    slots: int
    load: float | None
    holdout_requests: int
    holdout_first_arrival_s: float
    holdout_last_arrival_s: float
    note: str = ""
    version: int = PRIOR_VERSION
    folds: int = 1  # cross-fitted folds pooled (1: one holdout, the model fitted before it)

    def as_dict(self) -> dict[str, Any]:
        """Plain JSON-able fields (what the model carries)."""
        out = asdict(self)
        for k in ("candidates", "mean_log_ratio", "se", "upper"):
            out[k] = list(out[k])
        return out

    @property
    def group(self) -> str:
        """The group shape and load, as a label: ``8x32 saturated``, ``8x32 at 1.1x``."""
        load = "saturated" if self.load is None else f"at {self.load:g}x"
        return f"{self.workers}x{self.slots} {load}"

    def tags(self) -> dict[str, str]:
        """Registered-version tags (strings) that show the prior in the MLflow UI, one set
        per group shape: ``twin_prior.8x32.start_weight``, ..."""
        base = f"twin_prior.{self.workers}x{self.slots}"
        return {
            f"{base}.start_weight": f"{self.start_weight:g}",
            f"{base}.load": "saturated" if self.load is None else f"{self.load:g}",
            f"{base}.windows": str(self.windows),
            f"{base}.folds": str(self.folds),
            f"{base}.candidates": ",".join(f"{c:g}" for c in self.candidates),
            f"{base}.mean_log_ratio": ",".join(f"{m:.4f}" for m in self.mean_log_ratio),
            f"{base}.se": ",".join(f"{s:.4f}" for s in self.se),
            f"{base}.upper": ",".join(f"{u:.4f}" for u in self.upper),
        }

    @staticmethod
    def from_dict(data: Any, where: str = "the model") -> TwinPrior:
        """A prior from its plain form; a UserError naming ``where`` and the field at fault."""
        if not isinstance(data, dict):
            raise UserError(f"twin prior of {where}: expected a mapping, got {type(data).__name__}")
        names = [f for f in TwinPrior.__dataclass_fields__ if f not in ("note", "version", "folds")]
        missing = [n for n in names if n not in data]
        if missing:
            raise UserError(f"twin prior of {where}: missing field(s) {', '.join(missing)}")
        version = data.get("version", PRIOR_VERSION)
        if version != PRIOR_VERSION:
            raise UserError(
                f"twin prior of {where}: version {version!r}, this release reads {PRIOR_VERSION}"
            )
        try:
            prior = TwinPrior(
                start_weight=float(data["start_weight"]),
                candidates=tuple(float(c) for c in data["candidates"]),
                mean_log_ratio=tuple(float(m) for m in data["mean_log_ratio"]),
                se=tuple(float(s) for s in data["se"]),
                upper=tuple(float(u) for u in data["upper"]),
                windows=int(data["windows"]),
                overlap=float(data["overlap"]),
                block_requests=int(data["block_requests"]),
                workers=int(data["workers"]),
                slots=int(data["slots"]),
                load=None if data["load"] is None else float(data["load"]),
                holdout_requests=int(data["holdout_requests"]),
                holdout_first_arrival_s=float(data["holdout_first_arrival_s"]),
                holdout_last_arrival_s=float(data["holdout_last_arrival_s"]),
                note=str(data.get("note", "")),
                folds=int(data.get("folds", 1)),
            )
        except (TypeError, ValueError) as exc:
            raise UserError(f"twin prior of {where}: a field has the wrong type ({exc})") from None
        prior.check(where)
        return prior

    def check(self, where: str) -> None:
        """Refuse a prior that contradicts itself; a UserError naming the field."""
        k = len(self.candidates)
        problems = [
            (0.0 in self.candidates, "candidates must hold 0"),
            (all(0.0 <= c <= 1.0 for c in self.candidates), "candidates must be in [0, 1]"),
            (self.start_weight in self.candidates, "start_weight is not one of the candidates"),
            (
                len(self.mean_log_ratio) == len(self.se) == len(self.upper) == k,
                "mean_log_ratio, se and upper need one value per candidate",
            ),
            (self.workers >= 1 and self.slots >= 1, "workers and slots must be >= 1"),
            (self.windows >= 0 and self.block_requests >= 1, "windows >= 0, block_requests >= 1"),
            (self.load is None or self.load > 0, "load must be > 0 or null (saturated)"),
            (self.folds >= 1, "folds must be >= 1"),
        ]
        for ok, msg in problems:
            if not ok:
                raise UserError(f"twin prior of {where}: {msg}")


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
    saw) replayed under every candidate, paired; none when the fold is shorter than a block.
    ``tag`` tells the folds apart in the shared ``w = 0`` replays."""
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


def attach_priors(estimator: CompletionEstimator, priors: list[TwinPrior]) -> None:
    """Keep ``priors`` with ``estimator`` (plain dicts: the model file needs no lab class)."""
    setattr(estimator, PRIOR_ATTRIBUTE, [p.as_dict() for p in priors])


def model_priors(estimator: CompletionEstimator, where: str = "the model") -> list[TwinPrior]:
    """The priors a model carries (none for a model trained before priors existed); a
    UserError naming ``where`` if they do not parse."""
    raw = getattr(estimator, PRIOR_ATTRIBUTE, None)
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise UserError(f"twin prior of {where}: expected a list, got {type(raw).__name__}")
    return [TwinPrior.from_dict(d, where) for d in raw]


def twin_prior(
    source: str | CompletionEstimator, workers: int | None = None, slots: int | None = None
) -> TwinPrior | None:
    """The prior of a model (a path, an MLflow URI or alias, or a loaded estimator) for a group
    of ``workers`` x ``slots`` (any shape when not given: the first measured), or None."""
    where = source if isinstance(source, str) else f"the '{source.name}' estimator"
    est = load_estimator(source) if isinstance(source, str) else source
    for p in model_priors(est, where):
        if (workers is None or p.workers == workers) and (slots is None or p.slots == slots):
            return p
    return None


def prior_config(prior: TwinPrior, config: TwinConfig | None = None) -> TwinConfig:
    """``config`` with its start weight at the prior's (a UserError if it is no candidate)."""
    config = config or TwinConfig()
    if prior.start_weight not in config.candidates:
        raise UserError(
            f"twin prior: start weight {prior.start_weight:g} is not one of this twin's "
            f"candidates {list(config.candidates)}"
        )
    return replace(config, start_weight=prior.start_weight)


def prior_test(prior: TwinPrior, config: TwinConfig | None = None) -> SequentialTest:
    """The sequential test a twin starts from: at the prior's weight, no online evidence yet
    (it needs ``min_windows`` blocks of its own, and the cooldown, before it can switch)."""
    cfg = prior_config(prior, config)
    return SequentialTest(tuple(cfg.candidates), cfg)


@dataclass(frozen=True)
class PriorStart:
    """Where a consumer's twin starts from a model's prior, and why (``test`` None: ``w = 0``)."""

    test: SequentialTest | None
    note: str
    stats: dict[str, Any] = field(default_factory=dict)


def prior_start(
    estimator: CompletionEstimator | None,
    workers: int,
    slots: int,
    load: float | None,
    config: TwinConfig | None = None,
) -> PriorStart | None:
    """The start of a twin beside ``estimator`` on a ``workers`` x ``slots`` group at ``load``
    (None: saturated) from the model's prior: None when the model carries none; a start at
    ``w = 0`` with the reason when no prior fits this shape or the prior does not parse."""
    if estimator is None or getattr(estimator, PRIOR_ATTRIBUTE, None) is None:
        return None
    config = config or TwinConfig()
    try:
        priors = model_priors(estimator, f"the '{estimator.name}' model")
    except UserError as exc:
        return PriorStart(None, f"{exc}; the twin starts at w = 0", {"twin_prior": "invalid"})
    fit = [p for p in priors if p.workers == workers and p.slots == slots]
    if not fit:
        shapes = ", ".join(p.group for p in priors) or "no shape"
        note = (
            f"twin prior measured on {shapes}, this group is {workers}x{slots}: not used, the "
            "twin starts at w = 0"
        )
        return PriorStart(None, note, {"twin_prior": "other shape"})
    prior = min(fit, key=lambda p: _load_distance(p.load, load))
    if prior.start_weight not in config.candidates:
        note = f"twin prior's weight {prior.start_weight:g} is no candidate here: w = 0"
        return PriorStart(None, note, {"twin_prior": "other candidates"})
    stats = {
        "twin_prior": "used",
        "twin_prior_weight": prior.start_weight,
        "twin_prior_group": prior.group,
        "twin_prior_windows": prior.windows,
        "twin_prior_folds": prior.folds,
        "twin_prior_mean_log_ratios": list(prior.mean_log_ratio),
        "twin_prior_se": list(prior.se),
        "twin_prior_upper": list(prior.upper),
    }
    here = "saturated" if load is None else f"at {load:g}x"
    where = "the holdout" if prior.folds == 1 else f"{prior.folds} cross-fitted folds"
    note = (
        f"twin prior ({prior.group}, {prior.windows} windows of {where}): starting at "
        f"w = {prior.start_weight:g}"
    )
    if prior.load != load:
        note += f" (this group runs {here}; the online test decides from here)"
    return PriorStart(prior_test(prior, config), note, stats)


def live_start(
    estimator: CompletionEstimator | None, workers: int, slots: int, config: TwinConfig
) -> SequentialTest | None:
    """Where a live twin (service, gateway) beside ``estimator`` starts: the model's prior for
    this ``workers`` x ``slots`` group (saturated), else None (``w = 0``); logs which and why."""
    begun = prior_start(estimator, workers, slots, None, config)
    if begun is None:
        return None
    logging.getLogger("balanceroute.twin").info("%s", begun.note)
    return begun.test


def _load_distance(a: float | None, b: float | None) -> float:
    """How far apart two loads are (saturated counts as a very high load)."""
    x = 100.0 if a is None else a
    y = 100.0 if b is None else b
    return abs(math.log(x / y))


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

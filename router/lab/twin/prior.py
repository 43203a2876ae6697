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

import math
from dataclasses import asdict, dataclass
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.model_store import load_estimator

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

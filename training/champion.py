"""The champion of the registered model: scored on a run's holdout, the promotion rule, and the
aliases a successful run moves (``champion`` last).

``train`` and ``pipeline`` share them: a candidate replaces the champion only if it beats it on
the *same* holdout, or when told to. Beats means lower Brier, and where both models' snapshot
predictions are at hand (:class:`Paired`), the paired difference's 95% interval (Student-t over
the holdout's requests) lies below zero: a slice of a few hundred requests cannot tell a 2%
difference from noise (issue 33's live loop promoted such a model, which then scored 1.4x its
holdout Brier live).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from balanceroute.features.causal import CausalConfig
from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import load_estimator, setup_mlflow
from balanceroute.router.lab.paired import t_interval
from balanceroute.training.evaluate import progress, score_holdout, unseen_holdout
from balanceroute.training.holdout import Holdout, observe_training_part


class RegistryConfig(Protocol):
    """What the champion's scoring and the aliases need of a run's configuration
    (``TrainConfig`` has it)."""

    experiment: str
    register_as: str
    horizon: int
    promote: bool


@dataclass(frozen=True, slots=True)
class Champion:
    """The registered champion, scored on this run's holdout (None fields: none to score)."""

    version: str | None = None
    kind: str | None = None
    brier: float | None = None
    note: str | None = None
    p_finish: np.ndarray | None = None  # at the holdout's snapshots


@dataclass(frozen=True, slots=True)
class BrierGain:
    """A candidate's Brier minus the champion's on the same snapshots: mean and 95% interval
    over the holdout's requests (each request's snapshots averaged first)."""

    mean: float
    low: float
    high: float
    requests: int

    def __str__(self) -> str:
        return f"difference {self.mean:+.4f} [{self.low:+.4f}, {self.high:+.4f}] over {self.requests:,} requests"


@dataclass(frozen=True)
class Paired:
    """The candidates' snapshot predictions on the holdout the champion is scored on."""

    predictions: dict[str, np.ndarray]
    holdout: Holdout
    horizon: int

    def gain(self, kind: str, champion: np.ndarray) -> BrierGain | None:
        """``kind``'s :class:`BrierGain` over ``champion``'s predictions (None: under two
        requests)."""
        y = (self.holdout.remaining <= self.horizon).astype(np.float64)
        d = (self.predictions[kind] - y) ** 2 - (champion - y) ** 2
        _, request = np.unique(self.holdout.index, return_inverse=True)
        per_request = np.bincount(request, weights=d) / np.bincount(request)
        mean, half, n = t_interval(per_request)
        if n < 2:
            return None
        return BrierGain(mean, mean - half, mean + half, n)


def score_champion(cfg: RegistryConfig, holdout: Holdout) -> Champion:
    """The current ``champion`` of ``cfg.register_as`` evaluated on ``holdout`` (read-only)."""
    setup_mlflow(cfg.experiment)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    try:
        version = MlflowClient().get_model_version_by_alias(cfg.register_as, "champion")
    except MlflowException:
        return Champion(note="no champion yet")
    try:
        est = load_estimator(f"models:/{cfg.register_as}/{version.version}")
    except UserError as exc:
        return Champion(version.version, note=f"the champion cannot be loaded ({exc})")
    if est.horizon != cfg.horizon:
        return Champion(
            version.version,
            est.name,
            note=f"the champion predicts {est.horizon} iterations ahead, this run {cfg.horizon}",
        )
    progress(f"scoring champion version {version.version} ({est.name}) on this holdout")
    fresh = unseen_holdout(est, holdout)  # refitted on the training part if it saw the holdout
    if fresh is est and est.learns_online:  # fitted on other data: let it see the training part
        observe_training_part(est, holdout, CausalConfig())
    scored = score_holdout(fresh, holdout, cfg.horizon)
    return Champion(
        version.version, est.name, float(scored.metrics["brier"]), None, scored.p_finish
    )


def promotion(
    metrics: dict[str, dict[str, Any]],
    champion: Champion,
    promote: bool,
    paired: Paired | None = None,
) -> tuple[str, bool, str]:
    """``(candidate kind, promoted, why)``: the run's best estimator by validation Brier, and
    whether it replaces the champion (it must beat it on the same holdout, with ``paired`` by
    the paired interval, or ``promote``)."""
    candidate = min(metrics, key=lambda k: metrics[k]["brier"])
    mine = metrics[candidate]["brier"]
    if promote:
        return candidate, True, "--promote"
    if champion.version is None:
        return candidate, True, champion.note or "no champion yet"
    if champion.brier is None:
        return candidate, False, f"{champion.note}: use --promote to replace it"
    scores = f"brier {mine:.4f} against the champion's {champion.brier:.4f} on this holdout"
    gain = None
    if paired is not None and champion.p_finish is not None:
        gain = paired.gain(candidate, champion.p_finish)
    if gain is not None:
        if gain.high < 0:
            return candidate, True, f"{scores}: better ({gain})"
        verdict = "worse" if gain.low > 0 else "the interval reaches 0"
        return candidate, False, f"{scores}: not better ({gain}: {verdict})"
    if mine < champion.brier:
        return candidate, True, f"{scores}: better"
    return candidate, False, f"{scores}: not better"


def move_aliases(
    cfg: RegistryConfig,
    versions: dict[str, str],
    metrics: dict[str, dict[str, Any]],
    champion: Champion,
    paired: Paired | None = None,
) -> dict[str, Any]:
    """After a successful run: each kind's alias, then ``challenger``, then (if promoted)
    ``champion``, in one short step. Returns what moved and why."""
    from mlflow import MlflowClient

    client = MlflowClient()
    candidate, promoted, why = promotion(metrics, champion, cfg.promote, paired)
    ranked = sorted(versions, key=lambda k: metrics[k]["brier"])
    aliases = {kind: versions[kind] for kind in versions}
    if promoted and len(ranked) > 1:
        aliases["challenger"] = versions[ranked[1]]
    elif not promoted:
        aliases["challenger"] = versions[candidate]
    if promoted:
        aliases["champion"] = versions[candidate]
    for alias, version in aliases.items():
        client.set_registered_model_alias(cfg.register_as, alias, version)
    verb = "is the new champion" if promoted else "stays challenger; champion unchanged"
    progress(f"{candidate} {verb} ({why})")
    return {
        "aliases": aliases,
        "candidate": candidate,
        "promoted": promoted,
        "promotion": why,
        "champion": candidate if promoted else champion.kind,
        "champion_version": versions[candidate] if promoted else champion.version,
        "champion_brier_on_holdout": champion.brier,
    }

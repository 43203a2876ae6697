"""The champion of the registered model: scored on a run's holdout, the promotion rule, and the
aliases a successful run moves (``champion`` last).

``train`` and ``pipeline`` share them: a candidate replaces the champion only if it beats it on
the *same* holdout (lower Brier), or when told to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from balanceroute.features.causal import CausalConfig
from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import load_estimator, setup_mlflow
from balanceroute.training.evaluate import evaluate_estimator, progress, unseen_holdout
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
    scored, _ = evaluate_estimator(fresh, holdout, cfg.horizon)
    return Champion(version.version, est.name, float(scored["brier"]))


def promotion(
    metrics: dict[str, dict[str, Any]], champion: Champion, promote: bool
) -> tuple[str, bool, str]:
    """``(candidate kind, promoted, why)``: the run's best estimator by validation Brier, and
    whether it replaces the champion (it must beat it on the same holdout, or ``promote``)."""
    candidate = min(metrics, key=lambda k: metrics[k]["brier"])
    mine = metrics[candidate]["brier"]
    if promote:
        return candidate, True, "--promote"
    if champion.version is None:
        return candidate, True, champion.note or "no champion yet"
    if champion.brier is None:
        return candidate, False, f"{champion.note}: use --promote to replace it"
    if mine < champion.brier:
        why = f"brier {mine:.4f} beats the champion's {champion.brier:.4f} on this holdout"
        return candidate, True, why
    why = f"brier {mine:.4f} does not beat the champion's {champion.brier:.4f} on this holdout"
    return candidate, False, why


def move_aliases(
    cfg: RegistryConfig,
    versions: dict[str, str],
    metrics: dict[str, dict[str, Any]],
    champion: Champion,
) -> dict[str, Any]:
    """After a successful run: each kind's alias, then ``challenger``, then (if promoted)
    ``champion``, in one short step. Returns what moved and why."""
    from mlflow import MlflowClient

    client = MlflowClient()
    candidate, promoted, why = promotion(metrics, champion, cfg.promote)
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

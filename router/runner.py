"""One replay, end to end: requests -> prefill releases -> policy -> simulator -> summary.

Used by ``balanceroute simulate``, the A/B harness and the benchmarks, so every entry point
resolves workloads, estimators and policies the same way and records the same configuration.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.schema import to_arrays
from balanceroute.features.split import time_split
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.keys import AUTO_KEY, resolve_key_source
from balanceroute.predict.registry import make_estimator
from balanceroute.router.cost import CostModel
from balanceroute.router.metrics import summarize
from balanceroute.router.policy import Policy, policy_class
from balanceroute.router.prefill import (
    PrefillConfig,
    ReleasedRequests,
    rate_scale_for_load,
    release,
)
from balanceroute.router.simulator import SimConfig, SimResult, simulate

TRAINING_FREE = ("none", "oracle")


@dataclass(frozen=True, slots=True)
class ReplaySpec:
    """Everything that defines one replay besides the requests."""

    router: str = "count-jsq"
    predictor: str | None = None
    model_uri: str | None = None
    router_options: dict[str, Any] = field(default_factory=dict)
    workers: int = 8
    slots: int = 64
    seed: int = 0
    cost: CostModel = field(default_factory=CostModel)
    prefill: PrefillConfig = field(default_factory=PrefillConfig)
    load: float | None = None

    def __post_init__(self) -> None:
        if self.workers < 1 or self.slots < 1:
            raise UserError(
                f"need at least one worker and one slot, got G={self.workers}, B={self.slots}"
            )
        from balanceroute.router.balance_route import takes_estimator

        if self.predictor is not None and not takes_estimator(self.router):
            raise UserError(
                f"--predictor only applies to brh and brh-paper (got router '{self.router}')"
            )


def split_for_training(frame: pd.DataFrame, fraction: float) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Time-ordered split: the earlier ``fraction`` trains, the rest is replayed from t = 0."""
    return time_split(frame, fraction, rebase_tail=True)


def build_estimator(
    name: str,
    *,
    replay: pd.DataFrame,
    history: pd.DataFrame | None,
    horizon: int,
    model_uri: str | None = None,
) -> CompletionEstimator:
    """An estimator ready to predict on ``replay``: loaded, trained on ``history``, or oracle."""
    if model_uri is not None:
        from balanceroute.training.registry import load_estimator

        est = load_estimator(model_uri)
        if est.name != name:
            raise UserError(f"model {model_uri} holds a '{est.name}' estimator, not '{name}'")
        return est
    params = {}
    if name == "exactmatch":
        has_keys = history is not None and bool(history["prompt_key"].notna().any())
        params["key"] = resolve_key_source(AUTO_KEY, has_keys)
    est = make_estimator(name, horizon=horizon, **params)
    if name == "oracle":
        return est.fit(replay)
    if name == "none":
        return est.fit()
    if history is None:
        raise UserError(f"estimator '{name}' needs training history or a --model-uri")
    return est.fit(history)


def build_policy(spec: ReplaySpec, estimator: CompletionEstimator | None) -> Policy:
    """The policy named by ``spec.router``, with its options and estimator."""
    cls = policy_class(spec.router)
    from balanceroute.router.balance_route import takes_options

    if takes_options(spec.router):
        return cls(estimator=estimator, **spec.router_options)
    if spec.router_options:
        raise UserError(
            f"router '{spec.router}' takes no options (got {sorted(spec.router_options)})"
        )
    return cls()


def released_requests(frame: pd.DataFrame, spec: ReplaySpec) -> tuple[ReleasedRequests, float]:
    """Run the prefill tier; returns the releases and the rate scale actually used."""
    arrays = to_arrays(frame)
    prefill = spec.prefill
    if spec.load is not None:
        if prefill.saturate:
            raise UserError("give either --load or --saturate, not both")
        scale = rate_scale_for_load(arrays, spec.load, spec.workers, spec.slots, spec.cost)
        prefill = PrefillConfig(**{**asdict(prefill), "rate_scale": scale})
    return release(arrays, prefill), prefill.rate_scale


def replay(
    frame: pd.DataFrame,
    spec: ReplaySpec,
    *,
    estimator: CompletionEstimator | None = None,
    released: ReleasedRequests | None = None,
    progress: bool = False,
    record_loads: bool = True,
) -> tuple[SimResult, dict[str, Any]]:
    """Replay ``frame`` under ``spec``; returns the raw result and its summary."""
    if released is None:
        released, scale = released_requests(frame, spec)
    else:
        scale = spec.prefill.rate_scale
    policy = build_policy(spec, estimator)
    config = SimConfig(
        workers=spec.workers,
        slots=spec.slots,
        cost=spec.cost,
        seed=spec.seed,
        progress=progress,
        record_loads=record_loads,
    )
    result = simulate(released, policy, config)
    summary = summarize(result)
    summary["config"] = {
        "router": result.policy,
        "predictor": spec.predictor,
        "model_uri": spec.model_uri,
        "workers": spec.workers,
        "slots": spec.slots,
        "seed": spec.seed,
        "cost": spec.cost.as_dict(),
        "prefill": {**spec.prefill.as_dict(), "rate_scale": scale},
        "offered_load": spec.load,
        "requests": len(frame),
    }
    return result, summary

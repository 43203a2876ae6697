"""The gateway's routing arms: the same policy objects and estimators as ``simulate``.

Each arm is a :class:`~balanceroute.router.policies.specs.RouterSpec` built with ``build_policy`` and, for
routers that look ahead, an estimator from :func:`~balanceroute.predict.factory.build_estimator`
(a loaded model; or one fitted on ``--history``; or a prediction service with the local one as
its fallback). A model URI is loaded through the one model lifecycle of ``serve`` and the gateway
(:mod:`balanceroute.serving.lifecycle`: a registry model in a child process, so MLflow never
enters the gateway). The policy holds a :class:`Handle` on its estimator, never the model
itself, so ``POST /admin/reload`` swaps the model between two decisions without rebuilding the
policy. The gateway mutes every handle: the policy's own updates are ignored and the
completion fan-out (:func:`fan_out`) teaches each model every finished request exactly once; a
request that left without finishing is taught to none (a truncated length is not an output
length).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Self

import numpy as np
import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.predict.base import (
    CompletedBatch,
    CompletionEstimator,
    Fitting,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.registry import estimator_class, estimator_names
from balanceroute.predict.remote import RemoteEstimator, preflight
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.registry import OFFLINE_ONLY
from balanceroute.router.policies.specs import RouterSpec, parse_arms
from balanceroute.router.policies.state import RequestTable
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.renew import load_now

log = logging.getLogger("balanceroute.gateway")


class Handle(CompletionEstimator):
    """A stable estimator for a policy: predictions from ``model`` (swappable), the policy's
    online updates to it unless ``muted``, the fan-out's through :meth:`learn`."""

    fitting = Fitting.NONE

    def __init__(self, model: CompletionEstimator) -> None:
        super().__init__(horizon=model.horizon)
        self.model = model
        self.muted = False
        self.fitted_ = True

    @property
    def name(self) -> str:  # type: ignore[override]
        return self.model.name

    @property
    def provides_survival(self) -> bool:  # type: ignore[override]
        return bool(self.model.provides_survival)

    @property
    def projection(self) -> str:  # type: ignore[override]
        return self.model.projection

    @property
    def learns_online(self) -> bool:  # type: ignore[override]
        return bool(self.model.learns_online)

    def fit(self, history: pd.DataFrame | None = None) -> Self:
        return self

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        return self.model.predict(batch, survival=survival)

    def observe(self, completions: CompletedBatch) -> None:
        if not self.muted:
            self.model.observe(completions)

    def learn(self, completions: CompletedBatch) -> None:
        """Teach the model ``completions`` whether or not the policy is muted."""
        self.model.observe(completions)

    def stats(self) -> dict[str, Any]:
        """The remote client's counters, when the model is one."""
        stats = getattr(self.model, "stats", None)
        return stats() if callable(stats) else {}


@dataclass
class Arm:
    """One routing arm: its label (the spec as given), policy and estimator handle."""

    label: str
    spec: RouterSpec
    policy: Policy
    handle: Handle | None
    version: str | None = None  # of the model its URI named when last loaded

    def describe(self) -> dict[str, Any]:
        est = self.spec.estimator
        return {
            "arm": self.label,
            "router": self.spec.router,
            "estimator": None if est is None else est.kind,
            "model_uri": None if est is None else est.model_uri,
            "options": dict(self.spec.options),
        }

    @property
    def model_uri(self) -> str | None:
        """The URI its model is loaded from (None: fitted, or no estimator)."""
        est = self.spec.estimator
        return None if self.handle is None or est is None else est.model_uri

    def swap(self, model: CompletionEstimator, version: str | None = None) -> None:
        """Predict with ``model`` from the next decision on (a prediction service keeps
        answering; ``model`` becomes its fallback)."""
        assert self.handle is not None
        self.version = version
        current = self.handle.model
        if isinstance(current, RemoteEstimator):
            current.fallback = model
        else:
            self.handle.model = model


def arm_specs(settings: GatewaySettings) -> list[RouterSpec]:
    """The arms the settings name: ``arms``, or the one ``router`` with ``estimator``."""
    if settings.arms is not None:
        specs = parse_arms(settings.arms)
        if settings.estimator is not None:
            raise UserError("--estimator applies to --router; with --arms give each its estimator")
    else:
        spec = RouterSpec.parse(settings.router)
        if settings.estimator is not None:
            if ":" in settings.router.split("{", 1)[0]:
                raise UserError("give the estimator in --router or in --estimator, not both")
            est = EstimatorSpec.parse(settings.estimator)
            spec = RouterSpec(spec.router, est, dict(spec.options), label=settings.router)
        specs = [spec]
    for spec in specs:
        if spec.router in OFFLINE_ONLY:
            raise UserError(f"router '{spec.router}' cannot run live: {OFFLINE_ONLY[spec.router]}")
    return specs


def live_estimator(
    spec: EstimatorSpec, history: pd.DataFrame | None, horizon: int
) -> tuple[CompletionEstimator, str | None]:
    """An estimator a live gateway can run, deployable, and its version: loaded through the
    model lifecycle, or fitted on ``history`` (version None)."""
    cls = estimator_class(spec.kind)
    if not cls.deployable:
        raise UserError(
            f"estimator '{spec.kind}' reads the future of a trace and cannot run live; "
            f"deployable ones: {', '.join(estimator_names(deployable=True))}"
        )
    if spec.needs_history and history is None:
        raise UserError(
            f"estimator '{spec.kind}' needs a model URI ({spec.kind}@models:/NAME@ALIAS or "
            f"{spec.kind}@FILE.joblib) or --history TRACE to be fitted on"
        )
    if spec.model_uri is not None:
        fresh = load_now(str(spec), spec.model_uri, kind=spec.kind)
        return fresh.estimator, fresh.resolved.version
    return build_estimator(spec, history=history, horizon=horizon), None


def build_arm(spec: RouterSpec, settings: GatewaySettings, history: pd.DataFrame | None) -> Arm:
    """One arm: its estimator (remote with a local fallback when a service URL is set) and a
    fresh policy holding a handle on it."""
    if spec.estimator is None:  # a router that does not look ahead
        return Arm(spec.label, spec, spec.build_policy(), None)
    horizon = spec.horizon or DEFAULT_HORIZON
    model, version = live_estimator(spec.estimator, history, horizon)
    if settings.estimator_url is not None:
        preflight(settings.estimator_url)
        model = RemoteEstimator(
            settings.estimator_url, fallback=model, timeout_s=settings.estimator_timeout_s
        )
    handle = Handle(model)
    return Arm(spec.label, spec, spec.build_policy(handle), handle, version)


def build_arms(settings: GatewaySettings, history: pd.DataFrame | None = None) -> list[Arm]:
    """Every arm of the settings, built (models loaded, fitted or reached) before serving."""
    return [build_arm(spec, settings, history) for spec in arm_specs(settings)]


# ---- the one fan-out of finished requests -------------------------------------------------------
# Every arm's model learns each completion exactly once. The active arm's policy still hears of
# every departure through ``on_complete`` (it frees the positions and updates its own state), but
# its estimator handle is muted (:class:`Handle`): here, and only here, each arm that learns online is taught the completions, whichever arm is
# routing, and the ring of recent completions keeps them for the next model reload.


def completed(
    table: RequestTable, positions: np.ndarray, output_tokens: np.ndarray, now: float
) -> CompletedBatch:
    """The completions of ``positions`` (their prompts read before the positions are reused)."""
    return CompletedBatch(
        prompt_tokens=table.prompt_tokens[positions].copy(),
        output_tokens=output_tokens,
        prompt_key=table.prompt_key[positions].copy(),
        time_s=np.full(positions.shape[0], now),
    )


def mute_policies(arms: Iterable[Arm]) -> None:
    """Close the policies' own path to their estimators: the fan-out teaches them."""
    for arm in arms:
        if arm.handle is not None:
            arm.handle.muted = True


def fan_out(
    arms: Iterable[Arm], batch: CompletedBatch, recent: RecentCompletions | None = None
) -> None:
    """Teach ``batch`` to every arm's model that learns online, once, and keep it in ``recent``."""
    if batch.size == 0:
        return
    for arm in arms:
        if arm.handle is None or not arm.handle.learns_online:
            continue
        try:
            arm.handle.learn(batch)
        except Exception:  # one arm's model must not starve the others
            log.exception("arm %s: learning from %d completions failed", arm.label, batch.size)
    if recent is not None:
        recent.add(batch)

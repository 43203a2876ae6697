"""One replay, end to end: requests -> prefill releases -> policy -> simulator -> summary.

Used by ``balanceroute simulate``, the A/B harness and the benchmarks, so every entry point
builds policies the same way and records the same configuration.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.files import write_json
from balanceroute.features.schema import to_arrays
from balanceroute.features.split import time_split
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.factory import build_estimator
from balanceroute.predict.remote import RemoteEstimator, preflight
from balanceroute.router.lab.metrics import summarize
from balanceroute.router.lab.prefill import (
    ReleasedRequests,
    arrival_rps,
    decode_capacity_rps,
    prefill_capacity_rps,
)
from balanceroute.router.lab.records import write_records
from balanceroute.router.lab.replay_spec import (
    ReplaySpec,
    released_requests,
    resolved_prefill,
)
from balanceroute.router.lab.simulator import SimConfig, SimResult, simulate
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.driver import attach_twin, twin_managed
from balanceroute.router.lab.twin.prior_start import prior_start
from balanceroute.router.lab.twin.schedule import ScheduledBlend
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.lab.twin.warmup import warm_start
from balanceroute.router.policies.policy import Policy


def load_report(
    frame: pd.DataFrame, released: ReleasedRequests, spec: ReplaySpec, scale: float
) -> dict[str, Any]:
    """Offered and achieved decode load: releases/s over the decode tier's estimated capacity
    (a prefill tier too small for the arrivals caps the second), and the prefill capacity."""
    arrays = to_arrays(frame)
    decode = decode_capacity_rps(
        arrays.prompt_tokens, arrays.output_tokens, spec.workers, spec.slots, spec.cost
    )
    span = float(released.release_s[-1] - released.release_s[0]) if released.size else 0.0
    achieved = None if span <= 0 else (released.size - 1) / span / decode
    prefill = resolved_prefill(frame, spec)
    return {
        "offered_load": spec.load,
        "achieved_decode_load": achieved,
        "decode_capacity_rps": decode,
        "arrival_rps": arrival_rps(arrays, scale),
        "prefill_instances": prefill.instances,
        "prefill_capacity_rps": prefill_capacity_rps(arrays.prompt_tokens, prefill),
    }


LOAD_SHORTFALL = 0.8
FALLBACK_WARNING = 0.5


def load_warning(report: dict[str, Any]) -> str | None:
    """A warning when the achieved decode load is far below the offered one."""
    asked, got = report["offered_load"], report["achieved_decode_load"]
    if asked is None or got is None or got >= LOAD_SHORTFALL * asked:
        return None
    return (
        f"asked for a decode load of {asked:g} but releases reached only {got:.2f}: the prefill "
        f"tier ({report['prefill_instances']} instances, about "
        f"{report['prefill_capacity_rps']:,.1f} requests/s) caps the arrivals "
        f"({report['arrival_rps']:,.1f}/s); size it with --prefill-instances N or "
        "--prefill-instances auto"
    )


def replay(
    frame: pd.DataFrame,
    spec: ReplaySpec,
    *,
    estimator: CompletionEstimator | None = None,
    released: ReleasedRequests | None = None,
    progress: bool = False,
    record_loads: bool = True,
    wrap: Callable[[Policy], Policy] | None = None,
    twin: TwinConfig | None = None,
    scheduled: tuple[float, dict[str, Any]] | None = None,
    warm: SequentialTest | None = None,
) -> tuple[SimResult, dict[str, Any]]:
    """Replay ``frame`` under ``spec``; returns the raw result and its summary. ``wrap`` may
    put the spec's policy inside another (one that watches the run, say). A twin-managed BR-H
    runs beside a live twin (``twin`` configures it), or at a weight a twin chose before the
    run (``scheduled``: weight and that twin's statistics); ``warm``: the live twin's test
    after its warm-up on earlier traffic (router/lab/twin/warmup.py)."""
    if released is None:
        released, scale = released_requests(frame, spec)
    else:
        scale = spec.prefill.rate_scale
    policy = spec.router.build_policy(estimator)
    # a remote estimator's predictions are what such a run measures: no twin (the guard)
    if twin_managed(policy) and not isinstance(estimator, RemoteEstimator):
        if scheduled is not None:
            policy = ScheduledBlend(policy, *scheduled)
        else:
            group = TwinGroup(spec.router, spec.workers, spec.slots, spec.cost, spec.seed)
            policy = attach_twin(policy, group, released, twin, warm)
    if wrap is not None:
        policy = wrap(policy)
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
    if not spec.prefill.saturate:
        summary["load"] = load_report(frame, released, spec, scale)
    est_spec = spec.router.estimator
    summary["config"] = {
        "router": result.policy,
        "estimator": None if est_spec is None else est_spec.kind,
        "model_uri": None if est_spec is None else est_spec.model_uri,
        "workers": spec.workers,
        "slots": spec.slots,
        "seed": spec.seed,
        "cost": spec.cost.as_dict(),
        "prefill": {**spec.prefill.as_dict(), "rate_scale": scale},
        "offered_load": spec.load,
        "requests": len(frame),
    }
    return result, summary


@dataclass(frozen=True, slots=True)
class RemoteSpec:
    """Predictions from a running ``balanceroute serve``, with the local estimator as fallback."""

    url: str
    timeout_s: float = 0.02


def simulate_workload(
    frame: pd.DataFrame,
    source: dict[str, Any],
    spec: ReplaySpec,
    out: Path,
    *,
    train_fraction: float = 0.3,
    remote: RemoteSpec | None = None,
    progress: bool = False,
    log: Callable[[str], None] = lambda message: None,
) -> dict[str, Any]:
    """One replay of a workload, end to end: train the router's estimator on the earlier
    ``train_fraction`` of the requests if it learns from history (and replay the rest), or load
    or build it; replay; write ``out/summary.json``, ``iterations.parquet``, ``requests.parquet``.
    """
    est_spec = spec.router.estimator
    estimator = None
    trained_on = None
    history = None
    if est_spec is not None:
        if est_spec.needs_history:
            history, frame = time_split(frame, train_fraction, rebase_tail=True)
            trained_on = {"requests": len(history), "fraction": train_fraction}
            log(
                f"training '{est_spec.kind}' on the first {len(history)} requests; replaying "
                f"the remaining {len(frame)}"
            )
        horizon = spec.router.horizon
        estimator = build_estimator(
            est_spec,
            history=history,
            replay=frame,
            horizon=max(1, DEFAULT_HORIZON if horizon is None else horizon),
        )
    warm = None
    if remote is not None:
        preflight(remote.url)
        estimator = RemoteEstimator(remote.url, fallback=estimator, timeout_s=remote.timeout_s)
    elif twin_managed(spec.router.build_policy(estimator)):
        horizon = spec.router.horizon
        warm = warm_start(
            history, spec, TwinConfig(), max(1, DEFAULT_HORIZON if horizon is None else horizon)
        )
        if warm is not None:
            log(
                f"twin: warm-up on {warm.warm_requests} training requests "
                f"({warm.test.decisions} blocks), starting at w = {warm.test.weight:g}"
            )
    # a model that carries the twin's prior from its holdout (a registered one) starts there
    prior = None
    if warm is None and remote is None and twin_managed(spec.router.build_policy(estimator)):
        load = None if spec.prefill.saturate else spec.load
        prior = prior_start(estimator, spec.workers, spec.slots, load)
        if prior is not None:
            log(prior.note)
    test = warm.test if warm is not None else None if prior is None else prior.test
    result, summary = replay(frame, spec, estimator=estimator, progress=progress, warm=test)
    if warm is not None:
        summary.update(warm.stats())
    if prior is not None:
        summary.update(prior.stats)
    warning = load_warning(summary["load"]) if "load" in summary else None
    if warning is not None:
        log(f"warning: {warning}")
    summary["config"]["workload"] = source
    summary["config"]["trained_on"] = trained_on
    if remote is not None:
        summary.update(estimator.stats())
        summary["config"]["estimator_url"] = remote.url
        calls, fell = summary["remote_calls"], summary["remote_fallbacks"]
        if calls and fell > FALLBACK_WARNING * calls:
            log(
                f"warning: {fell:,} of {calls:,} predictions fell back to the local estimator "
                f"(last error: {summary['remote_last_error']})"
            )
    write_records(result, out)
    write_json(out / "summary.json", summary)
    return summary

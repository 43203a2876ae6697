"""A model renewed: loaded (off the event loop), checked, taught the recent completions, swapped.

The steps, the same for ``serve``'s slots and the gateway's arms:

1. :func:`prepare` (a worker thread): the version the URI names now, loaded in a child process
   when it is a registry model (:mod:`.sources`), checked to be fitted, of the expected kind and,
   once warmed up, healthy (:func:`~balanceroute.predict.health.health_problem`);
2. :func:`replayed` (a worker thread): a copy of it taught the recent completions; kept only if
   still healthy, so a replay never breaks a sound model;
3. back on the event loop, under the caller's lock: the completions that came in meanwhile,
   then ``install`` (the swap), so no completion is lost between the replay and the swap.

Every step's failure becomes a :class:`ReloadOutcome` with ``error``; the old model stays.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
from collections.abc import Callable
from dataclasses import dataclass

import anyio.to_thread
from pydantic import BaseModel

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletedBatch, CompletionEstimator
from balanceroute.predict.health import canary_batch, health_problem
from balanceroute.predict.live_quality import stamp
from balanceroute.predict.model_store import is_file_reference, model_uri
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.sources import Resolved, fetch

log = logging.getLogger("balanceroute.lifecycle")

Install = Callable[[Resolved, CompletionEstimator], None]


class UnhealthyModel(RuntimeError):
    """A loaded version that fails its health check."""


class ReloadOutcome(BaseModel):
    """What a reload did to one model: the one result of ``serve``'s and the gateway's reloads.

    ``arm`` names the service's model slot or the gateway's routing arm (the field keeps the
    name the HTTP API has always answered with)."""

    arm: str
    previous_version: str | None
    version: str | None
    changed: bool
    error: str | None = None

    @property
    def status(self) -> str:
        """``failed``, ``swapped`` or ``unchanged``."""
        return "failed" if self.error else "swapped" if self.changed else "unchanged"


@dataclass(frozen=True, slots=True)
class Fresh:
    """A loaded, healthy version not yet serving."""

    resolved: Resolved
    estimator: CompletionEstimator


def reference_uri(ref: str) -> str:
    """The URI a model reference stands for: a file as is, a bare alias of the default model."""
    return ref if is_file_reference(ref) else model_uri(ref)


def prepare(
    uri: str,
    current: str | None,
    force: bool,
    *,
    kind: str | None = None,
    after_load: Callable[[], None] | None = None,
) -> Fresh | None:
    """The version ``uri`` names, loaded and healthy (None: it is ``current``, no ``force``)."""
    fetched = fetch(uri, current, force)
    if fetched is None:
        return None
    resolved, estimator = fetched
    estimator.check_fitted()
    stamp(estimator, resolved.name, resolved.version, resolved.metrics)  # the live gauges' labels
    if kind is not None and estimator.name != kind:
        raise UserError(f"model {uri} holds a '{estimator.name}' estimator, not '{kind}'")
    if after_load is not None:
        after_load()
    warm_up(estimator)
    problem = health_problem(estimator)
    if problem is not None:
        raise UnhealthyModel(f"version {resolved.version} fails its health check: {problem}")
    return Fresh(resolved, estimator)


def warm_up(estimator: CompletionEstimator) -> None:
    """One untimed canary prediction: the first call compiles kernels, which the health check's
    time budget is not about (a failure here is the health check's to report)."""
    with contextlib.suppress(Exception):
        estimator.predict(canary_batch(), survival=bool(estimator.provides_survival))


def replayed(label: str, fresh: Fresh, replay: CompletedBatch) -> Fresh:
    """``fresh`` after the replay, or as loaded if the replay fails or leaves it unhealthy."""
    if not replay.size:
        return fresh
    trial = copy.deepcopy(fresh.estimator)
    try:
        trial.observe(replay)
        problem = health_problem(trial)
    except Exception as exc:
        problem = f"{type(exc).__name__}: {exc}"
    if problem is None:
        return Fresh(fresh.resolved, trial)
    log.error(
        "model %s: replaying %d completions failed (%s); serving it without them",
        label,
        replay.size,
        problem,
    )
    return fresh


async def renew(
    label: str,
    uri: str,
    current: str | None,
    *,
    force: bool,
    recent: RecentCompletions,
    install: Install,
    lock: asyncio.Lock | None = None,
    kind: str | None = None,
    after_load: Callable[[], None] | None = None,
) -> ReloadOutcome:
    """Load, check, replay and swap ``label``'s model; what happened (``error``: it kept the old)."""
    unchanged = ReloadOutcome(arm=label, previous_version=current, version=current, changed=False)
    try:
        fresh = await anyio.to_thread.run_sync(
            lambda: prepare(uri, current, force, kind=kind, after_load=after_load)
        )
        if fresh is None:
            return unchanged
        seen = recent.total
        fresh = await anyio.to_thread.run_sync(replayed, label, fresh, recent.batch())
    except Exception as exc:  # a bad artifact or registry outage must not kill the server
        error = f"{type(exc).__name__}: {exc}"
        log.error("loading model %s from %s failed: %s", label, uri, exc)
        return unchanged.model_copy(update={"error": error})
    async with lock if lock is not None else contextlib.nullcontext():
        late = recent.since(seen)  # completions that came in meanwhile, then the swap
        if late.size:
            fresh.estimator.observe(late)
        install(fresh.resolved, fresh.estimator)
    return unchanged.model_copy(update={"version": fresh.resolved.version, "changed": True})


def load_now(label: str, ref: str, kind: str | None = None) -> Fresh:
    """A model for a process that is starting (blocking): loaded and checked; a UserError if not."""
    try:
        fresh = prepare(reference_uri(ref), None, True, kind=kind)
    except UnhealthyModel as exc:
        raise UserError(f"model {label} ({ref}): {exc}") from None
    assert fresh is not None
    return fresh

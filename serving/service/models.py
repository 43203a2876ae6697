"""The loaded models: one per slot (``a``, optional ``b``), selection, online updates and reload.

Concurrency model: the handlers run on the event loop thread; ``/v1/route`` decides in a worker
thread (:mod:`serving.service.routes.route`). Every call into an estimator holds :attr:`ModelSlots.lock`
(the route thread through :class:`SharedEstimator`), so a prediction never sees an update half
done. Observes are applied one at a time, in order: a small batch in place, a large one (more
than ``inline_rows``) to a copy of the model in a worker thread that is swapped in when
complete, so predictions never wait for a large update (they are answered by the model as it
was before the batch) and the result is the same as one in-place update. A reload fetches the new version from a worker thread
(slow, off the loop: :mod:`serving.service.sources`), then back on the loop replays the recent
completions into it, checks its health and swaps the slot's reference in one assignment: calls
before the swap are answered by the old version, calls after by the new one, none is dropped.

Health: a model answers a fixed canary batch with finite, in-range values within
:data:`CANARY_BUDGET_S`. A model failing it, or whose online update raised, makes ``/readyz``
fail until a reload replaces it; completions whose update broke a model never enter the replay
log, and a reload whose replay leaves the model unhealthy installs it without the replay.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import logging
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import anyio.to_thread

from balanceroute.predict.base import (
    CompletedBatch,
    CompletionEstimator,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.health import health_problem
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.renew import ReloadOutcome, renew
from balanceroute.serving.lifecycle.sources import Resolved
from balanceroute.serving.service.decode import CompletedColumns
from balanceroute.serving.service.schemas import ArmInfo, ModelRef

log = logging.getLogger("balanceroute.serve")

SLOTS = ("a", "b")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """An estimator and the version it came from."""

    slot: str
    resolved: Resolved
    estimator: CompletionEstimator
    loaded_at: str

    @property
    def kind(self) -> str:
        """The estimator's registry name (``gbdt``, ``survival``, ...)."""
        return self.estimator.name

    @property
    def version(self) -> str:
        """Registry version, or digest of a local file."""
        return self.resolved.version

    def ref(self) -> ModelRef:
        """What a response says about the model that answered."""
        return ModelRef(
            arm=self.slot, name=self.resolved.name, version=self.version, kind=self.kind
        )

    def info(self) -> ArmInfo:
        """What ``GET /v1/models`` says about it."""
        r = self.resolved
        est = self.estimator
        return ArmInfo(
            arm=self.slot,
            uri=r.uri,
            source=r.source,
            name=r.name,
            version=r.version,
            kind=self.kind,
            horizon=est.horizon,
            provides_survival=bool(est.provides_survival),
            aliases=list(r.aliases),
            run_id=r.run_id,
            metrics=r.metrics,
            params=r.params or _jsonable_params(est),
            loaded_at=self.loaded_at,
        )

    def answers_to(self, selector: str) -> bool:
        """Whether ``selector`` (slot, version, alias, NAME@ALIAS or NAME/VERSION) names it."""
        r = self.resolved
        names = {self.slot, r.version, *r.aliases, f"{r.name}/{r.version}"}
        names.update(f"{r.name}@{a}" for a in r.aliases)
        return selector in names


class UnknownModel(LookupError):
    """A selector that names no loaded model."""


class NotReady(RuntimeError):
    """No model is loaded yet for the slot asked for."""


def completed_batch(cols: CompletedColumns) -> CompletedBatch:
    """The estimator interface's view of decoded completions."""
    return CompletedBatch(cols.prompt_tokens, cols.output_tokens, cols.prompt_key, cols.time_s)


def batch_rows(batch: CompletedBatch, rows: slice) -> CompletedBatch:
    """Rows ``rows`` of a batch of completions."""
    return CompletedBatch(
        batch.prompt_tokens[rows],
        batch.output_tokens[rows],
        None if batch.prompt_key is None else batch.prompt_key[rows],
        None if batch.time_s is None else batch.time_s[rows],
    )


class SharedEstimator:
    """An estimator used from another thread: its predictions hold the store's lock."""

    def __init__(self, estimator: CompletionEstimator, lock: threading.Lock) -> None:
        self._estimator = estimator
        self._lock = lock

    def __getattr__(self, name: str) -> Any:
        return getattr(self._estimator, name)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        """The estimator's prediction, never during an update."""
        with self._lock:
            return self._estimator.predict(batch, survival=survival)


SwapHook = Callable[[str, LoadedModel | None, LoadedModel], None]


class ModelSlots:
    """Slots by label; ``slots`` is replaced as a whole on a swap, never mutated in place."""

    def __init__(
        self,
        uris: dict[str, str],
        *,
        replay_buffer: int = 65_536,
        inline_rows: int = 256,
        on_swap: SwapHook | None = None,
        on_outcome: Callable[[ReloadOutcome], None] | None = None,
        after_load: Callable[[], None] | None = None,
    ) -> None:
        self.uris = dict(uris)
        self.slots: dict[str, LoadedModel] = {}
        self.errors: dict[str, str] = {}
        self.broken: dict[str, str] = {}  # slot -> why its loaded model is unhealthy
        self.retry: dict[str, tuple[int, float]] = {}  # slot -> (failed loads, next try, monotonic)
        self.log = RecentCompletions(replay_buffer)
        self.inline_rows = max(0, int(inline_rows))
        self.lock = threading.Lock()
        self._checked_at = -1.0
        self.on_swap = on_swap
        self.on_outcome = on_outcome
        self.after_load = after_load
        self._reload_lock = asyncio.Lock()
        self._observe_lock = asyncio.Lock()

    # ---- selection -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Every configured slot has a healthy model."""
        return all(slot in self.slots and slot not in self.broken for slot in self.uris)

    def check_health(self, max_age_s: float = 1.0) -> dict[str, str]:
        """Run the canary on every loaded slot (at most once per ``max_age_s``); the broken ones."""
        now = time.monotonic()
        if now - self._checked_at >= max_age_s:
            self._checked_at = now
            for slot, m in self.slots.items():
                if slot in self.broken:
                    continue
                with self.lock:
                    problem = health_problem(m.estimator)
                if problem is not None:
                    self._mark_broken(slot, problem)
        return dict(self.broken)

    def _mark_broken(self, slot: str, why: str) -> None:
        if slot not in self.broken:
            log.error("model %s is unhealthy: %s (reload it to recover)", slot, why)
        self.broken[slot] = why

    def shared(self, model: LoadedModel) -> SharedEstimator:
        """``model``'s estimator for use from a worker thread."""
        return SharedEstimator(model.estimator, self.lock)

    def selectors(self) -> list[str]:
        """Every selector a request may use right now."""
        out: list[str] = []
        for m in self.slots.values():
            r = m.resolved
            for s in (m.slot, r.version, *r.aliases):
                if s not in out:
                    out.append(s)
        return out

    def select(self, selector: str | None) -> LoadedModel:
        """The slot a request asks for (default ``a``)."""
        slots = self.slots
        if selector is None:
            if "a" not in slots:
                raise NotReady(self.not_ready_reason("a"))
            return slots["a"]
        if selector in self.uris and selector not in slots:
            raise NotReady(self.not_ready_reason(selector))
        for slot in SLOTS:
            m = slots.get(slot)
            if m is not None and m.answers_to(selector):
                return m
        raise UnknownModel(
            f"no loaded model answers to '{selector}'; known selectors: "
            f"{', '.join(self.selectors()) or 'none (no model loaded yet)'}"
        )

    def not_ready_reason(self, slot: str) -> str:
        """Why ``slot`` has no healthy model (loading, the last error and the next retry, or
        its health check)."""
        if slot in self.slots and slot in self.broken:
            return f"model {slot} is unhealthy: {self.broken[slot]}"
        err = self.errors.get(slot)
        if not err:
            return f"model {slot} is still loading"
        out = f"model {slot} failed to load: {err}"
        if slot in self.retry:
            failures, at = self.retry[slot]
            wait = max(0.0, at - time.monotonic())
            out += f" (attempt {failures} failed; retrying in {wait:.0f} s)"
        return out

    # ---- online updates --------------------------------------------------------------------
    async def observe(self, cols: CompletedColumns) -> list[str]:
        """Feed completions to every loaded, healthy slot and, if no update failed, to the replay
        log; returns the slots fed. Batches up to ``inline_rows`` are applied in place; larger
        ones to a copy of the model in a worker thread, swapped in once complete, so
        predictions go on meanwhile (answered by the model before the batch)."""
        async with self._observe_lock:
            batch = completed_batch(cols)
            fed = [slot for slot in self.slots if slot not in self.broken]
            for slot in list(fed):
                current = self.slots[slot]
                try:
                    if cols.size <= self.inline_rows:
                        with self.lock:
                            current.estimator.observe(batch)
                    else:
                        updated = await anyio.to_thread.run_sync(self._updated, current, batch)
                        self.slots = {**self.slots, slot: updated}
                except Exception as exc:
                    self._mark_broken(slot, f"an update raised {type(exc).__name__}: {exc}")
                    fed.remove(slot)
            if all(slot not in self.broken for slot in self.slots):
                self.log.add(batch)
            return fed

    def _updated(self, model: LoadedModel, batch: CompletedBatch) -> LoadedModel:
        """A copy of ``model`` that has observed ``batch`` (in a worker thread)."""
        with self.lock:  # no prediction refreshes a lazy table while it is copied
            estimator = copy.deepcopy(model.estimator)
        estimator.observe(batch)
        return dataclasses.replace(model, estimator=estimator)

    # ---- loading ---------------------------------------------------------------------------
    async def reload(self, slot: str | None = None, *, force: bool = False) -> list[ReloadOutcome]:
        """Re-resolve the configured URIs and swap in versions that changed (all with ``force``)."""
        slots = [a for a in ([slot] if slot is not None else list(self.uris)) if a in self.uris]
        async with self._reload_lock:
            return list(await asyncio.gather(*(self._reload_one(a, force) for a in slots)))

    async def load_until_ready(self, longest_wait_s: float = 60.0) -> None:
        """Load every slot; retry the ones that fail with exponential back-off (1 s, 2 s, ...,
        ``longest_wait_s``) until each has a model."""
        await self.reload(force=True)
        failures = 0
        while missing := [a for a in self.uris if a not in self.slots]:
            failures += 1
            wait = min(2.0 ** (failures - 1), longest_wait_s)
            for slot in missing:
                self.retry[slot] = (failures, time.monotonic() + wait)
            await asyncio.sleep(wait)
            for slot in missing:
                if slot not in self.slots:
                    await self.reload(slot, force=True)
        self.retry.clear()

    async def _reload_one(self, slot: str, force: bool) -> ReloadOutcome:
        outcome = await self._load_slot(slot, force)
        if self.on_outcome is not None:  # in step with the state /readyz reads
            self.on_outcome(outcome)
        return outcome

    async def _load_slot(self, slot: str, force: bool) -> ReloadOutcome:
        current = self.slots.get(slot)
        outcome = await renew(
            slot,
            self.uris[slot],
            current.version if current else None,
            force=force,
            recent=self.log,
            install=lambda resolved, est: self._install(LoadedModel(slot, resolved, est, _now())),
            lock=self._observe_lock,
            after_load=self.after_load,
        )
        if outcome.error is not None:
            self.errors[slot] = outcome.error
        return outcome

    def _install(self, fresh: LoadedModel) -> None:
        old = self.slots.get(fresh.slot)
        self.slots = dict(sorted({**self.slots, fresh.slot: fresh}.items()))
        self.errors.pop(fresh.slot, None)
        self.broken.pop(fresh.slot, None)
        if self.on_swap is not None:
            self.on_swap(fresh.slot, old, fresh)
        log.info(
            "model %s: %s version %s (%s) is serving",
            fresh.slot,
            fresh.resolved.name,
            fresh.version,
            fresh.kind,
        )


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _jsonable_params(est: CompletionEstimator) -> dict:
    return {k: v for k, v in est.params().items() if isinstance(v, str | int | float | bool)}


def pin_lightgbm_threads(threads: int) -> bool:
    """Cap LightGBM's OpenMP threads process-wide once it is loaded (docs/design.md, "LightGBM in a server")."""
    if "lightgbm" not in sys.modules:
        return False
    import ctypes

    from lightgbm.basic import _LIB

    setter = getattr(_LIB, "LGBM_SetMaxThreads", None)
    if setter is None:
        return False
    setter(ctypes.c_int(int(threads)))
    return True

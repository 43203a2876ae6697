"""The loaded models: one per arm (``a``, optional ``b``), selection, online updates and reload.

Concurrency model: every request handler runs on the event loop thread and the estimators are
called there, so predictions, observations and swaps never interleave. A reload fetches the new
version from a worker thread (slow, off the loop: :mod:`serving.sources`), then back on the loop
replays the recent completions into it and swaps the arm's reference in one assignment: calls
before the swap are answered by the old version, calls after by the new one, none is dropped.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import anyio.to_thread
import numpy as np

from balanceroute.predict.base import CompletedBatch, CompletionEstimator
from balanceroute.serving.decode import CompletedColumns
from balanceroute.serving.schemas import ArmInfo, ModelRef, ReloadOutcome
from balanceroute.serving.sources import Resolved, fetch

log = logging.getLogger("balanceroute.serve")

ARMS = ("a", "b")


@dataclass(frozen=True, slots=True)
class LoadedModel:
    """An estimator and the version it came from."""

    arm: str
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
        return ModelRef(arm=self.arm, name=self.resolved.name, version=self.version, kind=self.kind)

    def info(self) -> ArmInfo:
        """What ``GET /v1/models`` says about it."""
        r = self.resolved
        est = self.estimator
        return ArmInfo(
            arm=self.arm,
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
        """Whether ``selector`` (arm, version, alias, NAME@ALIAS or NAME/VERSION) names it."""
        r = self.resolved
        names = {self.arm, r.version, *r.aliases, f"{r.name}/{r.version}"}
        names.update(f"{r.name}@{a}" for a in r.aliases)
        return selector in names


class UnknownModel(LookupError):
    """A selector that names no loaded model."""


class NotReady(RuntimeError):
    """No model is loaded yet for the arm asked for."""


class CompletionLog:
    """Ring buffer of the last ``capacity`` completions, replayed into a model before its swap."""

    def __init__(self, capacity: int) -> None:
        self.capacity = cap = int(capacity)
        self.prompt = np.zeros(cap, dtype=np.int64)
        self.output = np.zeros(cap, dtype=np.int64)
        self.key = np.zeros(cap, dtype=np.uint64)
        self.time = np.zeros(cap, dtype=np.float64)
        self.total = 0  # completions ever added; the next one goes to slot total % capacity

    def __len__(self) -> int:
        return min(self.total, self.capacity)

    def add(self, cols: CompletedColumns) -> None:
        """Append a batch in order, overwriting the oldest rows beyond the capacity."""
        cap = self.capacity
        if cap == 0 or cols.size == 0:
            return
        keep = slice(max(cols.size - cap, 0), cols.size)
        times = cols.time_s if cols.time_s is not None else np.full(cols.size, np.nan)
        slots = (self.total + np.arange(max(cols.size - cap, 0), cols.size)) % cap
        self.prompt[slots] = cols.prompt_tokens[keep]
        self.output[slots] = cols.output_tokens[keep]
        self.key[slots] = cols.prompt_key[keep]
        self.time[slots] = times[keep]
        self.total += cols.size

    def batch(self) -> CompletedBatch:
        """Everything kept, oldest first."""
        n = len(self)
        order = (self.total - n + np.arange(n)) % max(self.capacity, 1)
        return CompletedBatch(
            self.prompt[order], self.output[order], self.key[order], self.time[order]
        )


def completed_batch(cols: CompletedColumns) -> CompletedBatch:
    """The estimator interface's view of decoded completions."""
    return CompletedBatch(cols.prompt_tokens, cols.output_tokens, cols.prompt_key, cols.time_s)


SwapHook = Callable[[str, LoadedModel | None, LoadedModel], None]


class ModelStore:
    """Arms by label; ``arms`` is replaced as a whole on a swap, never mutated in place."""

    def __init__(
        self,
        uris: dict[str, str],
        *,
        replay_buffer: int = 65_536,
        on_swap: SwapHook | None = None,
        on_outcome: Callable[[ReloadOutcome], None] | None = None,
        after_load: Callable[[], None] | None = None,
    ) -> None:
        self.uris = dict(uris)
        self.arms: dict[str, LoadedModel] = {}
        self.errors: dict[str, str] = {}
        self.log = CompletionLog(replay_buffer)
        self.on_swap = on_swap
        self.on_outcome = on_outcome
        self.after_load = after_load
        self._reload_lock = asyncio.Lock()

    # ---- selection -------------------------------------------------------------------------
    @property
    def ready(self) -> bool:
        """Every configured arm has a model."""
        return all(arm in self.arms for arm in self.uris)

    def selectors(self) -> list[str]:
        """Every selector a request may use right now."""
        out: list[str] = []
        for m in self.arms.values():
            r = m.resolved
            for s in (m.arm, r.version, *r.aliases):
                if s not in out:
                    out.append(s)
        return out

    def select(self, selector: str | None) -> LoadedModel:
        """The arm a request asks for (default ``a``)."""
        arms = self.arms
        if selector is None:
            if "a" not in arms:
                raise NotReady(self.not_ready_reason("a"))
            return arms["a"]
        if selector in self.uris and selector not in arms:
            raise NotReady(self.not_ready_reason(selector))
        for arm in ARMS:
            m = arms.get(arm)
            if m is not None and m.answers_to(selector):
                return m
        raise UnknownModel(
            f"no loaded model answers to '{selector}'; known selectors: "
            f"{', '.join(self.selectors()) or 'none (no model loaded yet)'}"
        )

    def not_ready_reason(self, arm: str) -> str:
        """Why ``arm`` has no model (still loading, or the last error)."""
        err = self.errors.get(arm)
        return f"model {arm} failed to load: {err}" if err else f"model {arm} is still loading"

    # ---- online updates --------------------------------------------------------------------
    def observe(self, cols: CompletedColumns) -> list[str]:
        """Feed completions to every loaded arm and the replay log; returns the arms fed."""
        self.log.add(cols)
        batch = completed_batch(cols)
        fed = []
        for arm, m in self.arms.items():
            m.estimator.observe(batch)
            fed.append(arm)
        return fed

    # ---- loading ---------------------------------------------------------------------------
    async def reload(self, arm: str | None = None, *, force: bool = False) -> list[ReloadOutcome]:
        """Re-resolve the configured URIs and swap in versions that changed (all with ``force``)."""
        arms = [a for a in ([arm] if arm is not None else list(self.uris)) if a in self.uris]
        async with self._reload_lock:
            return list(await asyncio.gather(*(self._reload_one(a, force) for a in arms)))

    async def _reload_one(self, arm: str, force: bool) -> ReloadOutcome:
        outcome = await self._load_arm(arm, force)
        if self.on_outcome is not None:  # in step with the state /readyz reads
            self.on_outcome(outcome)
        return outcome

    async def _load_arm(self, arm: str, force: bool) -> ReloadOutcome:
        current = self.arms.get(arm)
        before = current.version if current else None
        try:
            fresh = await anyio.to_thread.run_sync(self._prepare, arm, before, force)
        except Exception as exc:  # a bad artifact or registry outage must not kill the server
            self.errors[arm] = f"{type(exc).__name__}: {exc}"
            log.error("loading model %s from %s failed: %s", arm, self.uris[arm], exc)
            return ReloadOutcome(
                arm=arm,
                previous_version=before,
                version=before,
                changed=False,
                error=self.errors[arm],
            )
        if fresh is None:
            return ReloadOutcome(arm=arm, previous_version=before, version=before, changed=False)
        self._install(fresh)
        return ReloadOutcome(arm=arm, previous_version=before, version=fresh.version, changed=True)

    def _prepare(self, arm: str, current: str | None, force: bool) -> LoadedModel | None:
        fetched = fetch(self.uris[arm], current, force)
        if fetched is None:
            return None
        resolved, estimator = fetched
        estimator.check_fitted()
        if self.after_load is not None:
            self.after_load()
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        return LoadedModel(arm, resolved, estimator, stamp)

    def _install(self, fresh: LoadedModel) -> None:
        if len(self.log):
            fresh.estimator.observe(self.log.batch())
        old = self.arms.get(fresh.arm)
        self.arms = dict(sorted({**self.arms, fresh.arm: fresh}.items()))
        self.errors.pop(fresh.arm, None)
        if self.on_swap is not None:
            self.on_swap(fresh.arm, old, fresh)
        log.info(
            "model %s: %s version %s (%s) is serving",
            fresh.arm,
            fresh.resolved.name,
            fresh.version,
            fresh.kind,
        )


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

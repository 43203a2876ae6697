"""Everything one gateway holds, wired together, and its life: start, reload, stop.

The parts: the live group and pool (:mod:`.state`), the decision loop (:mod:`.dispatch`), the
arms and their estimators (:mod:`.arms`), the switchback (:mod:`~balanceroute.router.lab.switchback`),
rank health (:mod:`.health`), the completion log (:mod:`~balanceroute.serving.lifecycle.completion_log`),
metrics (:mod:`.metrics`) and prompt counting (:mod:`~balanceroute.features.prompts`). At shutdown ``OUT/ticks.parquet``
keeps every tick's sample (epoch time, pool size, imbalance, arm, and the per-rank loads and running
counts the gateway sees): what the live benchmark aligns with the engine's iterations to tell when
requests were waiting at the gateway, and how far the gateway's view was from the engine's. Requests themselves are run by
the data plane (:mod:`.plane`), through the decider (:mod:`.decider`). Model reloads (:mod:`.reload`) load off the event loop and swap between two decisions.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from pathlib import Path
from typing import Any

import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.files import write_parquet
from balanceroute.features.prompts import PromptCounter
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.live_quality import LiveQuality
from balanceroute.router.lab.switchback import Switchback, twin_agreement
from balanceroute.serving.gateway.arms import Arm, build_arms
from balanceroute.serving.gateway.clock import ClockedGroup, EngineCounters
from balanceroute.serving.gateway.dispatch import Dispatcher, tick_table
from balanceroute.serving.gateway.health import RankHealth
from balanceroute.serving.gateway.metrics import GatewayMetrics, LoopLag
from balanceroute.serving.gateway.reload import reload_arms
from balanceroute.serving.gateway.settings import GatewaySettings
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.gateway.timing import When
from balanceroute.serving.gateway.twins import GatewayTwins
from balanceroute.serving.gateway.upstream import RankPool
from balanceroute.serving.lifecycle.completion_log import CompletionLog
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.renew import ReloadOutcome
from balanceroute.training.live_ab import save_switchback

log = logging.getLogger("balanceroute.gateway")
UPSTREAM_KEY_ENV = "BALANCEROUTE_UPSTREAM_API_KEY"
RECENT_COMPLETIONS = 65_536  # replayed into a reloaded model, as ``serve``'s default


class Drain:
    """The shutdown drain: on SIGTERM (or SIGINT) the front stops accepting and :meth:`begin`
    starts the clock; the streams in flight get ``timeout_s`` to finish, then :attr:`over` is
    set and each exchange still running ends its answer itself (an SSE error event and
    ``[DONE]``, or a 503 before the first token), so no stream is cut silently."""

    def __init__(self, timeout_s: float, announce: bool = True) -> None:
        self.timeout_s = timeout_s
        self.announce = announce  # False in a relay worker: the decider logs the one line
        self.draining = False
        self.over = asyncio.Event()

    def begin(self) -> None:
        """Shutdown began: new requests get 503; :attr:`over` is set after ``timeout_s``."""
        if self.draining:
            return
        self.draining = True
        if self.announce:
            log.warning("shutting down: the streams in flight get %g s to finish", self.timeout_s)
        asyncio.get_running_loop().call_later(self.timeout_s, self.over.set)


class Gateway:
    """The gateway's state and parts; one per app."""

    def __init__(
        self,
        settings: GatewaySettings,
        arms: list[Arm],
        counter: PromptCounter,
        *,
        upstream_key: str | None = None,
        group: LiveGroup | None = None,
    ) -> None:
        self.settings = settings
        self.arms = arms
        self.counter = counter
        self.upstream_key = upstream_key
        self.clock = time.monotonic
        self.metrics = GatewayMetrics()
        self.group = group or LiveGroup.sized(settings.group, settings.slots, settings.max_pool)
        self.switchback = Switchback(
            [a.label for a in arms],
            settings.switch_every_s,
            settings.warmup,
            settings.seed,
            self.clock(),
        )
        self.sample_s = settings.sample_every(self.switchback.switching)
        self.loop_lag = LoopLag(self.metrics.loop_lag)
        self.quality = LiveQuality()  # predictions at admission beside outcomes, on /metrics
        self.metrics.registry.register(self.quality)
        self.recent = RecentCompletions(RECENT_COMPLETIONS)
        self.twins = GatewayTwins(arms, settings.group, settings.slots, seed=settings.seed,
                                  enabled=settings.twins, nice=settings.twin_nice)  # fmt: skip
        self.dispatcher = Dispatcher(
            self.group,
            arms,
            self.switchback,
            self.metrics,
            seed=settings.seed,
            clock=self.clock,
            recent=self.recent,
            twins=self.twins,
            when=When(settings.decide),
        )
        self.dispatcher.quality = self.quality
        # the ranks' kept-alive connections for health checks, step-counter reads and models
        self.probes = RankPool(settings)
        self.health = RankHealth(settings, self.group, self.metrics, self.dispatcher.wake,
                                 self.probes.get)  # fmt: skip
        self.drain = Drain(settings.drain_timeout_s)
        self.health.auth_headers = lambda rank: self.upstream_headers(rank, "health")
        out = None if settings.out is None else Path(settings.out)
        self.out = out
        self.log = CompletionLog(
            None if out is None else out / "completions", settings.rotate_bytes, settings.rotate_s
        )
        self._tasks: list[asyncio.Task] = []
        self._writes: list[asyncio.Future] = []
        self.reload_lock = asyncio.Lock()
        self.started_epoch = time.time()

    # ---- what the routes and the relay need ------------------------------------------------
    @property
    def arm_label(self) -> str:
        active = self.dispatcher.active
        return active.label if active is not None else self.arms[0].label

    def upstream_headers(self, rank: int, request_id: str) -> dict[str, str]:
        """Headers of a forwarded request: JSON, its id, the rank (header mode), the key."""
        return forward_headers(self.settings, self.upstream_key, rank, request_id)

    # ---- life -----------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the tick, the health checks, the step-counter reads and the log writer."""
        s = self.settings
        loop = asyncio.get_running_loop()
        self.dispatcher.decide()  # activates the first arm
        self.dispatcher.on_lag = self.loop_lag.record  # sampled by the decision loop's timer
        self.twins.start()
        self._tasks = [
            loop.create_task(self.dispatcher.run(s.tick_s, self.sample_s), name="gateway-tick"),
            loop.create_task(self.health.run(), name="gateway-health"),
            loop.create_task(self._rotate(), name="gateway-log"),
        ]
        if isinstance(self.group, ClockedGroup):  # the ranks' step counters set their clocks
            counters = EngineCounters(self.group, s.rank_header is not None, s.health_interval_s)
            self._tasks.append(
                loop.create_task(counters.run(self.probes.get), name="gateway-steps")
            )

    async def _rotate(self) -> None:
        while True:
            await asyncio.sleep(1.0)
            if self.log.due():
                self._write_log()

    def _write_log(self) -> None:
        part = self.log.take()
        if part is not None:
            fut = asyncio.get_running_loop().run_in_executor(None, write_parquet, *part)
            self._writes = [w for w in self._writes if not w.done()] + [fut]

    async def stop(self) -> dict[str, Any] | None:
        """Stop the loops, write the completion log and the switchback results."""
        for t in self._tasks:
            t.cancel()
        for t in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await t
        await asyncio.get_running_loop().run_in_executor(None, self.twins.stop)
        self._write_log()
        if self.out is not None:
            ticks = tick_table(self.dispatcher.ticks, self.group.ranks)
            self._writes.append(
                asyncio.get_running_loop().run_in_executor(
                    None, write_parquet, self.out / "ticks.parquet", ticks
                )
            )
        if self._writes:
            await asyncio.gather(*self._writes, return_exceptions=True)
        saved = await self.save_ab() if self.out is not None else None
        self.probes.close()
        return saved

    # ---- the switchback -------------------------------------------------------------------
    def config(self) -> dict[str, Any]:
        """The resolved configuration, written next to the results."""
        s = self.settings
        keys = {"slots", "rank_header", "switch_every_s", "seed", "tick_s", "decide",
                "max_pool", "tokenizer", "estimator_url"}  # fmt: skip
        return {"ranks": s.group, "rank_urls": s.rank_urls, "warmup_s": s.warmup,
                "sample_s": self.sample_s,
                "arms": {a.label: a.describe() for a in self.arms}, **s.model_dump(include=keys)}  # fmt: skip

    def ab_summary(self) -> dict[str, Any]:
        """The switchback so far, with each arm's router step p50 and the activations."""
        summary = self.switchback.summary(self.clock())
        steps = self.dispatcher.step_p50_us()
        for arm, row in summary["per_arm"].items():
            row["router_step_p50_us"] = steps.get(arm)
        summary["activations"] = self.dispatcher.activations
        summary["admission_violations"] = self.dispatcher.violations
        summary["loop_lag"] = self.loop_lag.summary()
        timing = self.dispatcher.timing
        summary["decision_timing"] = {"decide": timing.when.value, **timing.margin.snapshot()}
        summary["twins"] = self.twins.stats()
        summary["twin_feed"] = self.twins.feed_stats()
        counterfactual = self.twins.comparison()
        summary["twin_comparison"] = counterfactual
        if counterfactual is not None:
            summary["twin_agreement"] = twin_agreement(summary, counterfactual)
        return summary

    async def save_ab(self) -> dict[str, Any]:
        """``OUT/ab/summary.json`` and ``report.md`` now (and MLflow when tracking is on)."""
        if self.out is None:
            raise UserError("the gateway has no output folder (--out DIR)")
        summary, config = self.ab_summary(), self.config()
        track = self.settings.track and len(self.arms) > 1
        return await asyncio.get_running_loop().run_in_executor(
            None, lambda: save_switchback(summary, config, self.out / "ab", track=track)
        )

    # ---- reload ---------------------------------------------------------------------------
    async def reload(self) -> list[ReloadOutcome]:
        """Renew every arm's model (:mod:`.reload`); a failure keeps the old one."""
        async with self.reload_lock:
            out = await reload_arms(self.arms, self.recent)
            by_label = {a.label: a for a in self.arms}
            for o in out:
                if o.status != "unchanged":
                    self.metrics.reloads.labels(o.status).inc()
                if o.changed and o.arm in by_label:
                    self.twins.renew(by_label[o.arm])  # the twin's verdict was the old model's
            return out


def forward_headers(
    settings: GatewaySettings, upstream_key: str | None, rank: int, request_id: str
) -> dict[str, str]:
    """Headers of a forwarded request: JSON, its id, the rank (header mode), the key."""
    headers = {"content-type": "application/json", "x-request-id": request_id}
    if settings.rank_header is not None:
        headers[settings.rank_header] = str(rank)
    if upstream_key:
        headers["authorization"] = f"Bearer {upstream_key}"
    return headers


def build_gateway(settings: GatewaySettings) -> Gateway:
    """Everything the settings name, checked and loaded (UserErrors for what is wrong), on a
    group that ages running requests by the ranks' clocks."""
    counter = PromptCounter(settings.tokenizer)
    history: pd.DataFrame | None = None
    if settings.history is not None:
        history, _ = load_workload(WorkloadSpec(trace=settings.history))
    arms = build_arms(settings, history)
    group = ClockedGroup.sized(settings.group, settings.slots, settings.max_pool)
    gateway = Gateway(settings, arms, counter, upstream_key=os.environ.get(UPSTREAM_KEY_ENV) or None,
                      group=group)  # fmt: skip
    group.attach(gateway.clock)
    return gateway

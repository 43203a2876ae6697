"""The decision loop: the configured policy on the live state, on every arrival, every finished
stream and every tick while requests wait.

A decision tells the active policy which requests left since the last one (``on_complete``,
before their positions are reused; the finished ones teach every arm's model, :func:`.arms.fan_out`),
asks it for the admissions due (``route``), checks them with the simulator's invariants
(:func:`~balanceroute.router.policies.admission.admission_violation`) and resolves each admitted
request's future with its rank, which the request's handler forwards at once; the decision's
bookkeeping (step time, counts, predictions) runs after that (:func:`after_forward`). Decisions
run on the event loop, so the state never changes under a policy. Arms switch at window
boundaries (:class:`Switchback`), each ``reset`` once per activation.

When a decision is made is :class:`~.timing.Timing`'s (``--decide``); a request that arrives
alone into a group with a free slot and no held decision is decided at once. The loop
(:meth:`Dispatcher.run`) decides and samples every tick while requests wait; while they only
run, it pulses the group's step estimate when the group counts steps by ticks, and samples every
``sample_s``; idle, it sleeps until an arrival, a finish, a re-queue, a rank's return or the
next sample wakes it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from balanceroute.predict.live_quality import LiveQuality
from balanceroute.router.lab.switchback import Switchback
from balanceroute.router.policies.admission import admission_violation
from balanceroute.router.policies.policy import RunContext
from balanceroute.serving.gateway.arms import Arm, completed, fan_out, mute_policies
from balanceroute.serving.gateway.metrics import GatewayMetrics
from balanceroute.serving.gateway.state import Departure, LiveGroup
from balanceroute.serving.gateway.timing import Timing, When
from balanceroute.serving.gateway.twins import GatewayTwins
from balanceroute.serving.lifecycle.recent import RecentCompletions

log = logging.getLogger("balanceroute.gateway")
STEP_SAMPLES = 100_000
TICK_SAMPLES = 2_000_000
# uvloop's timers count whole milliseconds and can fire up to one early: an idle loop that woke
# just before its sample was due would tick twice for it (twice the wake-ups of a quiet gateway)
TIMER_SLACK_S = 0.001


class Dispatcher:
    """Admits waiting requests with the active arm's policy, at the times its :class:`Timing`
    says; one per gateway."""

    def __init__(
        self,
        group: LiveGroup,
        arms: list[Arm],
        switchback: Switchback,
        metrics: GatewayMetrics,
        *,
        seed: int = 0,
        clock: Callable[[], float] = time.monotonic,
        recent: RecentCompletions | None = None,
        twins: GatewayTwins | None = None,
        when: When = When.STEP,
    ) -> None:
        self.group = group
        self.timing = Timing(group, clock, when)
        self.twins = twins
        self.arms = {a.label: a for a in arms}
        self.recent = recent
        mute_policies(arms)
        self.switchback = switchback
        self.metrics = metrics
        self.seed = seed
        self.clock = clock
        self.active: Arm | None = None
        self.activations = 0
        self.waiters: dict[int, asyncio.Future[int]] = {}
        self.step_ns: dict[str, deque[int]] = {a: deque(maxlen=STEP_SAMPLES) for a in self.arms}
        self.violations = 0
        self._scheduled = False
        self._alarm: asyncio.Future[bool] | None = None  # the idle loop's, rung by wake()
        self._late: float | None = None  # how late the loop's last timer ran, seconds
        self.on_lag: Callable[[float], None] | None = None  # told that with each regular sample
        self.quality: LiveQuality | None = None  # told each admission's prediction
        self._load_gauges = [metrics.load.labels(str(g)) for g in range(group.ranks)]
        self._running_gauges = [metrics.running.labels(str(g)) for g in range(group.ranks)]
        self._fallbacks: dict[str, int] = dict.fromkeys(self.arms, 0)
        # (epoch s, pool size, imbalance, arm, view) every tick, written to OUT/ticks.parquet;
        # view: the per-rank loads then running counts as int32 bytes (compact for long runs)
        self.ticks: deque[tuple[float, int, float, str, bytes]] = deque(maxlen=TICK_SAMPLES)

    # ---- requests -------------------------------------------------------------------------
    def waiter(self, position: int) -> asyncio.Future[int]:
        """The future the decision loop resolves with ``position``'s rank."""
        fut = asyncio.get_running_loop().create_future()
        self.waiters[position] = fut
        return fut

    def forget(self, position: int) -> None:
        self.waiters.pop(position, None)

    def wake(self) -> None:
        """Decide soon (calls coalesce into one decision per event-loop pass, or into the held
        decision: :meth:`Timing.holds`)."""
        if self.timing.holds(self.decide, self._batches()):
            self._ring()
            return
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._scheduled_decision)
        self._ring()

    def arrived(self, now: float | None = None) -> None:
        """A request joined the pool at ``now``: decided at once if it waits alone and a slot is
        free (at low load every arrival: its first token does not wait for the loop's next pass),
        else at the loop's next pass (:meth:`wake`) or in the held decision (:meth:`Timing.holds`)."""
        group = self.group
        if self.timing.holds(self.decide, self._batches()):
            self._ring()
        elif group.pool.size == 1 and (group.running_total < group.slots  # every rank has room
                                       or group.has_free_slot()):
            self._ring()
            self.decide(now)
        else:
            self.wake()

    def _batches(self) -> bool:
        """Whether the active arm's policy gains from a step's decisions made together."""
        return self.active is None or self.active.policy.batches

    def _ring(self) -> None:
        """Wake the idle loop (:meth:`_pause`), if it sleeps."""
        _ring(self._alarm, False)

    def _scheduled_decision(self) -> None:
        self._scheduled = False
        self.decide()

    # ---- the decision ---------------------------------------------------------------------
    def _activate(self, now: float) -> Arm:
        arm = self.arms[self.switchback.current(now).arm]
        if arm is not self.active:
            g = self.group
            arm.policy.reset(RunContext(g.ranks, g.slots, g.table, seed=self.seed))
            if self.active is not None:
                self.metrics.arm.labels(self.active.label).set(0)
            self.metrics.arm.labels(arm.label).set(1)
            self.active = arm
            self.activations += 1
            log.info("arm %s routes from now on", arm.label)
        return arm

    def _tell_departures(self, arm: Arm, now: float) -> None:
        deps = self.group.take_departures()
        if not deps:
            return
        pos, out = _columns(deps)
        learned = np.fromiter((d.learn for d in deps), dtype=bool, count=len(deps))
        batch = completed(self.group.table, pos[learned], out[learned], now)
        try:
            arm.policy.on_complete(pos, out, now, self.group.iteration)
        except Exception:  # the positions must still be freed: say it, carry on
            log.exception("arm %s: on_complete failed", arm.label)
        fan_out(self.arms.values(), batch, self.recent)
        self.group.release(deps)

    def decide(self, now: float | None = None) -> int:
        """One decision at ``now`` (None: the clock's); how many requests it admitted."""
        now = self.clock() if now is None else now
        arm = self._activate(now)
        self._tell_departures(arm, now)
        group = self.group
        if not group.pool.size:  # a finish's wake with nobody waiting: no state to build
            self.pulse(now)
            return 0
        state = group.snapshot(now)
        if self.twins is not None:  # the live twin's weight (read, never waited for)
            self.twins.tick(group.iteration)
            self.twins.apply(arm)
        due = state.admissions_due
        if due == 0:
            return 0
        t0 = time.perf_counter_ns()
        adm = arm.policy.route(state)
        took = time.perf_counter_ns() - t0
        positions, ranks = adm.positions.tolist(), adm.workers.tolist()
        order = group.pool.order
        problem = admission_violation(
            positions,
            ranks,
            due=due,
            free=state.free_slots.tolist(),
            maximal=bool(arm.policy.maximal),
            waiting=lambda p: p in order,
        )
        if problem is not None:  # a policy bug: never crash the gateway, say it loudly
            self.violations += 1
            log.error("arm %s broke an admission invariant: %s", arm.label, problem)
            return 0
        group.pool.passed(positions)
        for p, g in zip(positions, ranks, strict=True):
            group.start(p, g)
            fut = self.waiters.pop(p, None)
            if fut is not None and not fut.done():
                fut.set_result(g)
        at = adm.positions  # read now (a position freed later is reused), as an array: less work
        if self.quality is not None and positions and arm.handle is not None:
            t = group.table  # the deployed model's prediction at admission
            after_forward(self.quality.admit, arm.handle, positions, t.prompt_tokens[at],
                          t.prompt_key[at])  # fmt: skip
        after_forward(self._decided, arm.label, took, group.arrival_s[at], now)
        return len(positions)

    def _decided(self, label: str, took_ns: int, arrivals: np.ndarray, now: float) -> None:
        """A decision's bookkeeping, once its requests are forwarded: the router's step time,
        the counts, and each admitted request's wait since its arrival."""
        self.step_ns[label].append(took_ns)
        self.metrics.step.labels(label).observe(took_ns * 1e-9)
        self.metrics.decisions.labels(label).inc()
        self.metrics.admitted.labels(label).inc(len(arrivals))
        for wait in (now - arrivals).tolist():
            self.metrics.wait.labels(label).observe(wait)
            self.switchback.admitted(wait, now)

    # ---- the tick -------------------------------------------------------------------------
    def pulse(self, now: float) -> int:
        """The group's step estimate brought up to ``now`` without a decision (nobody waits),
        and the twins' clock with it; the iteration."""
        iteration = self.group.pulse(now)
        if self.twins is not None:
            self.twins.tick(iteration)
        return iteration

    def sample(self, *, regular: bool = True) -> float:
        """The tick's sample (pool size, imbalance, the per-rank view the live benchmark checks
        against the engine's iteration log) into ``ticks``; ``regular`` (every ``sample_s``, not
        the extra ones of ticks while requests wait): also the metrics and the switchback's
        imbalance, so the switchback's samples stay even in time; the imbalance (max minus mean
        load)."""
        now = self.clock()
        group = self.group
        loads = group.loads()
        per_rank = loads.tolist()  # G numbers: Python's max and sum, not numpy's calls
        imbalance = max(per_rank) - sum(per_rank) / len(per_rank) if per_rank else 0.0
        if regular:
            self._activate(now)  # an idle gateway makes no decision at a window's boundary
        label = self.active.label if self.active is not None else ""
        running = group.inflight.tolist()
        view = np.array(per_rank + running, dtype=np.int32).tobytes()
        self.ticks.append((time.time(), group.pool.size, imbalance, label, view))
        if not regular:
            return imbalance
        m = self.metrics
        m.imbalance.labels(label).observe(imbalance)
        m.pool.set(group.pool.size)
        for gauge, load in zip(self._load_gauges, per_rank, strict=True):
            gauge.set(load)
        for gauge, n in zip(self._running_gauges, running, strict=True):
            gauge.set(n)
        self.switchback.sample(imbalance, now)
        self._count_fallbacks()
        return imbalance

    def _count_fallbacks(self) -> None:
        for label, arm in self.arms.items():
            if arm.handle is None:
                continue
            fell = int(arm.handle.stats().get("remote_fallbacks", 0) or 0)
            if fell > self._fallbacks[label]:
                self.metrics.fallbacks.labels(label).inc(fell - self._fallbacks[label])
                self._fallbacks[label] = fell

    def _busy(self) -> bool:
        """Whether the next tick has work: requests wait, departures wait for ``on_complete``,
        or requests run on a group whose step estimate counts ticks."""
        group = self.group
        return bool(group.pool.size or group.departures or group.needs_tick())

    async def _pause(self, tick_s: float, next_sample: float) -> None:
        """One tick when busy; else asleep until woken (:meth:`wake`) or the sample is due (a
        future and a timer: no task per sleep, as ``wait_for`` would make)."""
        if self._busy():
            due = self.clock() + tick_s
            await asyncio.sleep(tick_s)
            self._late = self.clock() - due
            return
        wait = next_sample - self.clock()
        if wait <= 0:
            return
        loop = asyncio.get_running_loop()
        self._alarm = alarm = loop.create_future()
        timer = loop.call_later(wait + TIMER_SLACK_S, _ring, alarm, True)
        try:
            if await alarm:  # the timer, not an arrival: how late it ran
                self._late = self.clock() - next_sample - TIMER_SLACK_S
        finally:
            timer.cancel()
            self._alarm = None

    def tick(self, now: float, next_sample: float) -> bool:
        """One pass of the loop at ``now``: a decision if requests wait (or departures do), else
        the pulse; a sample while requests wait (and as the pool empties) or when
        ``next_sample`` is due; whether the sample was the regular one."""
        group = self.group
        queued = group.pool.size
        waiting = bool(queued or group.departures)
        if waiting and not self.timing.held:
            self.decide()
        elif not waiting:
            self.pulse(now)
        regular = now >= next_sample
        if regular or queued or group.pool.size:  # the pass that empties the pool: a row too
            self.sample(regular=regular)
        return regular

    async def run(self, tick_s: float, sample_s: float | None = None) -> None:
        """The loop (module docstring) until cancelled: decisions every ``tick_s`` while requests
        wait, a regular sample every ``sample_s`` (``tick_s`` when None); with each regular
        sample ``on_lag`` hears how late the loop ran the timer that woke it (the gateway's
        loop-lag sampler, :class:`~.metrics.LoopLag`, without a timer of its own)."""
        every = tick_s if sample_s is None else max(sample_s, tick_s)
        next_sample = self.clock()
        while True:
            self._late = None
            await self._pause(tick_s, next_sample)
            try:
                now = self.clock()
                if self.tick(now, next_sample):
                    next_sample = max(next_sample + every, now)
                    if self._late is not None:
                        self.timing.loop_lag(self._late)
                        if self.on_lag is not None:
                            self.on_lag(self._late)
            except Exception:  # a bug must not stop the loop that admits every request
                log.exception("decision tick failed")

    def step_p50_us(self) -> dict[str, float | None]:
        """Median router step per arm, in microseconds."""
        return {
            a: (float(np.median(np.asarray(v))) / 1e3 if v else None)
            for a, v in self.step_ns.items()
        }


def tick_table(ticks: Iterable[tuple[float, int, float, str, bytes]], ranks: int) -> pa.Table:
    """The tick samples as ``OUT/ticks.parquet``: ``time_s`` (epoch), ``pool``, ``imbalance``
    (max minus mean load), ``arm``, and the gateway's view per rank, ``loads`` (KV tokens) and
    ``running`` (requests it holds on the rank), as lists of ``ranks``."""
    rows = list(ticks)
    view = np.frombuffer(b"".join(r[4] for r in rows), dtype=np.int32).reshape(len(rows), 2 * ranks)
    offsets = pa.array(np.arange(len(rows) + 1, dtype=np.int32) * ranks)
    return pa.table(
        {
            "time_s": pa.array([r[0] for r in rows], pa.float64()),
            "pool": pa.array([r[1] for r in rows], pa.int64()),
            "imbalance": pa.array([r[2] for r in rows], pa.float64()),
            "arm": pa.array([r[3] for r in rows], pa.string()),
            "loads": pa.ListArray.from_arrays(offsets, pa.array(view[:, :ranks].ravel())),
            "running": pa.ListArray.from_arrays(offsets, pa.array(view[:, ranks:].ravel())),
        }
    )


def after_forward(fn: Callable[..., None], *args: Any) -> None:
    """``fn(*args)`` once the current callback (which forwards the admitted requests) is
    over: bookkeeping off a request's path to its rank; at once outside an event loop."""
    try:
        asyncio.get_running_loop().call_soon(fn, *args)
    except RuntimeError:
        fn(*args)


def _ring(alarm: asyncio.Future[bool] | None, timer: bool) -> None:
    if alarm is not None and not alarm.done():
        alarm.set_result(timer)


def _columns(batch: list[Departure]) -> tuple[np.ndarray, np.ndarray]:
    pos = np.fromiter((d.position for d in batch), dtype=np.int64, count=len(batch))
    out = np.fromiter((d.output_tokens for d in batch), dtype=np.int64, count=len(batch))
    return pos, out

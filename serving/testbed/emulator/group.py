"""The synchronized decode group and its clock: pure asyncio, no HTTP (testable alone).

Model (the simulator's, ``router/lab/simulator.py``). All ranks share one clock. Iteration ``k``
starts by removing cancelled requests, then admits: each rank moves requests from its own FCFS
waiting queue into its free slots (at most ``B`` running). Its duration is
``t_fixed + t_comm + t_token * max_g L_g(k)`` with ``L_g`` the rank's KV load after admission
(prompt + tokens generated so far, over its running requests), divided by the time scale. At its
end every running request emits one token; a request leaves after emitting its last one. A
request that reaches a rank during iteration ``k`` joins at ``k + 1`` at the earliest; with no
iteration running (every rank empty) the next one starts at once. A cancelled request (client
gone) leaves at the next iteration start, keeping the tokens it was given.

Colocated prefill (a cost model with ``t_prefill > 0``, e.g. fitted to a real engine): each
rank computes its admitted prompts first come first served, at most ``prefill_chunk_tokens``
(``P_g``) a step; the step lasts ``t_fixed + t_comm + max_g (t_token L_g + t_prefill P_g)``,
so one rank's chunk stalls the group. A request emits nothing until the step that computes its
last prompt token, which emits its first token (vLLM's chunked prefill). ``L_g`` counts the
whole prompt from admission, as the simulator does.

Clock. Each iteration's end is an absolute deadline: the previous deadline plus this
iteration's duration, so a late wake-up shortens the next wait instead of shifting every later
iteration (no drift). Lateness (emission time minus deadline) and the interval between
emissions are recorded against the cost model. A group later than ``resync_s`` re-anchors its
clock at the current time (counted in ``resyncs``); after an idle spell the clock starts again
at the first arrival. ``model_start_s`` is the cost model's own clock (what the simulator's
``t_start`` holds): consecutive iterations add their durations, an idle spell adds its wall
time times the time scale.

Hot path. The token fan-out is one pass over the running requests per iteration: it bumps a
counter and resolves the waiting handler's future; the handler writes pre-encoded bytes.
Metrics take one weighted observation per rank and iteration.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import numpy as np

from balanceroute.features.files import write_parquet
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.iterlog import IterationLog
from balanceroute.serving.testbed.emulator.metrics import RankMetrics
from balanceroute.serving.testbed.emulator.request import (
    ABORTED,
    CANCELLED,
    FINISHED,
    RUNNING,
    EmuRequest,
)

HOP_S = 0.002


class RankState:
    """One rank: its running requests, its FCFS waiting queue, its KV load and metrics."""

    __slots__ = (
        "admitted_now",
        "cancel_flag",
        "index",
        "load",
        "metrics",
        "prefill",
        "prefilling",
        "rng",
        "running",
        "waiting",
    )

    def __init__(self, index: int, config: EmulatorConfig) -> None:
        self.index = index
        self.running: list[EmuRequest] = []
        self.waiting: deque[EmuRequest] = deque()
        self.load = 0
        self.admitted_now = 0
        self.cancel_flag = False
        self.prefilling: deque[EmuRequest] = deque()  # prompts not yet computed, FCFS
        self.prefill = 0  # prompt tokens computed in this step
        self.metrics = RankMetrics(config.model, index)
        self.rng = np.random.default_rng([config.seed, index])


class DecodeGroup:
    """G ranks of B slots advancing in lockstep; :meth:`run` is the clock task."""

    def __init__(
        self,
        config: EmulatorConfig,
        log: IterationLog | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.config = config
        self.rank_states = [RankState(g, config) for g in range(config.ranks)]
        self.log = log if log is not None else IterationLog(None, config.ranks)
        self.clock = clock
        self.t0 = clock()
        self.epoch = time.time()
        self.k = 0  # index of the current (or next) iteration
        self.in_iteration = False
        self.model_end = 0.0
        self.resyncs = 0
        self.seq = 0
        self.accepted = 0
        self._wake: asyncio.Future | None = None
        self._writes: list[asyncio.Future] = []
        self.lateness_s = 0.0  # of the last iteration

    # ---- requests -------------------------------------------------------------------------

    def new_request(
        self,
        rank: int,
        *,
        prompt_tokens: int,
        max_tokens: int,
        ignore_eos: bool,
        stream: bool,
        endpoint: str,
        request_id: str | None = None,
        recv_s: float | None = None,
    ) -> EmuRequest:
        """A request for ``rank`` with its output length drawn (not yet submitted);
        ``recv_s`` is when it reached the server (default: now)."""
        state = self.rank_states[rank]
        target = max_tokens if ignore_eos else self.config.output.draw(state.rng, max_tokens)
        seq = self.seq
        self.seq += 1
        return EmuRequest(
            seq,
            request_id or f"emu-{rank}-{seq}",
            rank,
            endpoint,
            stream,
            prompt_tokens,
            max_tokens,
            target,
            self.clock() if recv_s is None else recv_s,
        )

    def submit(self, req: EmuRequest) -> None:
        """Queue ``req`` on its rank; it joins at the next iteration start."""
        req.arrival_iter = self.k + 1 if self.in_iteration else self.k
        self.rank_states[req.rank].waiting.append(req)
        self.accepted += 1
        w = self._wake
        if w is not None and not w.done():
            w.set_result(None)

    def cancel(self, req: EmuRequest) -> None:
        """The client went away: the request leaves at the next iteration start."""
        if req.closed or req.cancelled:
            return
        req.cancelled = True
        self.rank_states[req.rank].cancel_flag = True
        req.wake()

    def release(self, req: EmuRequest) -> None:
        """One side (group or handler) is done with ``req``; the last one logs it."""
        req.refs -= 1
        if req.refs == 0:
            self.log.add_request(req.row(self.t0))
            if len(self.log.requests) >= self.log.CHUNK:
                self._flush_requests()

    def _close(self, req: EmuRequest, state: int, now: float) -> None:
        req.state = state
        req.finish_s = now
        metrics = self.rank_states[req.rank].metrics
        if state == FINISHED:
            metrics.success[req.finish_reason] += 1
            metrics.e2e.observe(now - req.recv_s)
        else:
            metrics.success["abort"] += 1
        req.wake()
        self.release(req)

    def _remove_cancelled(self, now: float) -> None:
        for rank in self.rank_states:
            if not rank.cancel_flag:
                continue
            rank.cancel_flag = False
            keep = []
            for r in rank.running:
                if r.cancelled:
                    rank.load -= r.prompt_tokens + r.generated
                    self._close(r, CANCELLED, now)
                else:
                    keep.append(r)
            rank.running = keep
            if any(r.cancelled for r in rank.waiting):
                for r in rank.waiting:
                    if r.cancelled:
                        self._close(r, CANCELLED, now)
                rank.waiting = deque(r for r in rank.waiting if not r.cancelled)

    def abort_all(self) -> None:
        """Close every request (shutdown): handlers end their responses."""
        now = self.clock()
        for rank in self.rank_states:
            for r in [*rank.running, *rank.waiting]:
                self._close(r, ABORTED, now)
            rank.running = []
            rank.waiting.clear()
            rank.prefilling.clear()
            rank.load = 0

    def has_work(self) -> bool:
        """True while any rank holds a running or waiting request."""
        return any(r.running or r.waiting for r in self.rank_states)

    # ---- the clock ------------------------------------------------------------------------

    def _admit(self, k: int, now: float) -> int:
        slots = self.config.slots
        prefills = self.config.cost.prefills
        total = 0
        for rank in self.rank_states:
            free = slots - len(rank.running)
            q = rank.waiting
            adm = 0
            while free > 0 and q:
                r = q.popleft()
                r.admit_iter = k
                r.admit_s = now
                r.state = RUNNING
                rank.running.append(r)
                rank.load += r.prompt_tokens
                rank.metrics.prompt_tokens += r.prompt_tokens
                if prefills:
                    r.prefill_left = r.prompt_tokens
                    rank.prefilling.append(r)
                free -= 1
                adm += 1
            rank.admitted_now = adm
            total += adm
        return total

    def _prefill_step(self, loads: list[int]) -> float:
        """Each rank's prompt chunk for this step (FCFS within its budget); the step's duration."""
        cost = self.config.cost
        work = []
        for rank, load in zip(self.rank_states, loads, strict=True):
            budget = cost.prefill_chunk_tokens
            q = rank.prefilling
            while q and budget > 0:
                r = q[0]
                if r.closed:
                    q.popleft()
                    continue
                take = min(budget, r.prefill_left)
                r.prefill_left -= take
                budget -= take
                if r.prefill_left == 0:
                    q.popleft()
            rank.prefill = cost.prefill_chunk_tokens - budget
            work.append(cost.t_token_s * load + cost.t_prefill_s * rank.prefill)
        return cost.t_fixed_s + cost.t_comm_s + max(work)

    def _emit_prefilling(self, rank: RankState, t_end: float, prev_end: float | None) -> int:
        """End of an iteration on a rank that prefills: requests whose prompt is computed emit
        one token, the first for those whose last chunk this step computed; returns how many
        finished."""
        emitting = [r for r in rank.running if r.prefill_left == 0]
        n = len(emitting)
        m = rank.metrics
        rank.load += n
        firsts = done = 0
        for r in emitting:
            r.generated += 1
            if r.generated == 1:
                r.first_token_s = t_end
                m.ttft.observe(t_end - r.recv_s)
                firsts += 1
            done += r.generated == r.target
            w = r.waker
            if w is not None:
                r.waker = None
                if not w.done():
                    w.set_result(None)
        m.generation_tokens += n
        if n:
            m.iteration_tokens.observe(n)
        if n > firsts and prev_end is not None:
            m.tpot.observe(t_end - prev_end, n - firsts)
        if done:
            self._retire_finished(rank, t_end)
        return done

    def _retire_finished(self, rank: RankState, t_end: float) -> None:
        """The rank's requests that reached their target leave it, closed as finished."""
        keep = []
        for r in rank.running:
            if r.generated == r.target:
                rank.load -= r.prompt_tokens + r.generated
                self._close(r, FINISHED, t_end)
            else:
                keep.append(r)
        rank.running = keep

    def _emit(self, t_end: float, prev_end: float | None) -> tuple[int, int]:
        """End of an iteration: every running request emits one token (one pass)."""
        emitted = finished = 0
        prefills = self.config.cost.prefills
        for rank in self.rank_states:
            if prefills:
                before = rank.metrics.generation_tokens
                finished += self._emit_prefilling(rank, t_end, prev_end)
                emitted += rank.metrics.generation_tokens - before
                continue
            running = rank.running
            n = len(running)
            if n == 0:
                continue
            rank.load += n
            done_here = 0
            for r in running:
                g = r.generated + 1
                r.generated = g
                if g == r.target:
                    done_here += 1
                w = r.waker
                if w is not None:
                    r.waker = None
                    if not w.done():
                        w.set_result(None)
            m = rank.metrics
            m.generation_tokens += n
            m.iteration_tokens.observe(n)
            first = rank.admitted_now
            if first:
                for r in running[n - first :]:
                    r.first_token_s = t_end
                    m.ttft.observe(t_end - r.recv_s)
            if n > first and prev_end is not None:
                m.tpot.observe(t_end - prev_end, n - first)
            if done_here:
                self._retire_finished(rank, t_end)
            emitted += n
            finished += done_here
        return emitted, finished

    async def run(self) -> None:
        """Advance iterations while requests are in; idle (no iterations) otherwise."""
        loop = asyncio.get_running_loop()
        cfg = self.config
        clock = self.clock
        scale = cfg.time_scale
        t_fixed = cfg.cost.t_fixed_s + cfg.cost.t_comm_s
        t_token = cfg.cost.t_token_s
        prefills = cfg.cost.prefills
        ranks = self.rank_states
        log = self.log
        cols, per_rank = log.cols, log.per_rank
        prev_end: float | None = None
        deadline = 0.0
        while True:
            now = clock()
            self._remove_cancelled(now)
            if not self.has_work():
                prev_end = None
                if log.dir is not None:  # idle: what ran so far readable from the folder
                    self._flush_iterations()
                self._wake = loop.create_future()
                await self._wake
                self._wake = None
                continue
            if prev_end is None:  # after an idle spell: the clock starts again now
                start = now
                model_start = max(self.model_end, (now - self.t0) * scale)
            elif now - deadline > cfg.resync_s:  # too late to catch up: re-anchor the wall
                self.resyncs += 1  # clock; the model clock runs on (the simulator's would)
                start = now
                model_start = self.model_end
            else:
                start = deadline
                model_start = self.model_end
            k = self.k
            self.in_iteration = True
            admitted = self._admit(k, now)
            loads = [r.load for r in ranks]
            if prefills:
                duration = self._prefill_step(loads)
                per_rank["prefill"][log.j] = [r.prefill for r in ranks]
            else:
                duration = t_fixed + t_token * max(loads)
            deadline = start + duration / scale
            self.model_end = model_start + duration
            j = log.j
            per_rank["loads"][j] = loads
            per_rank["running"][j] = [len(r.running) for r in ranks]
            per_rank["waiting"][j] = [len(r.waiting) for r in ranks]
            while (remaining := deadline - clock()) > 0:
                # Short hops rather than one long sleep: on this kind of VM a process that
                # sleeps ~60 ms is woken 4 to 12 ms late (p90) while one that wakes every
                # 2 ms is not (benchmarks/live_testbed.py); the hops cost about 1% of a core.
                await asyncio.sleep(min(remaining, HOP_S))
            t_end = clock()
            self.in_iteration = False
            emitted, finished = self._emit(t_end, prev_end)
            t_done = clock()
            t0 = self.t0
            cols["iteration"][j] = k
            cols["start_s"][j] = now - t0
            cols["model_start_s"][j] = model_start
            cols["duration_s"][j] = duration
            cols["deadline_s"][j] = deadline - t0
            cols["end_s"][j] = t_end - t0
            cols["done_s"][j] = t_done - t0
            cols["admitted"][j] = admitted
            cols["emitted"][j] = emitted
            cols["finished"][j] = finished
            log.j = j + 1
            if log.full():
                self._flush_iterations()
            self.lateness_s = t_end - deadline
            self.k = k + 1
            prev_end = t_end

    # ---- the log ----------------------------------------------------------------------------

    def _in_thread(self, fn: Callable[..., Any], *args: Any) -> None:
        fut = asyncio.get_running_loop().run_in_executor(None, fn, *args)
        self._writes = [w for w in self._writes if not w.done()]
        self._writes.append(fut)

    def _flush_iterations(self) -> None:
        table = self.log.take()
        if table is not None:
            self._in_thread(write_parquet, self.log.iteration_path(), table)

    def _flush_requests(self) -> None:
        table = self.log.take_requests()
        if table is not None:
            self._in_thread(write_parquet, self.log.request_path(), table)

    async def flush(self) -> None:
        """Write everything buffered and wait for every pending write (at shutdown)."""
        self._flush_iterations()
        self._flush_requests()
        if self._writes:
            await asyncio.gather(*self._writes)
        self._writes = []

    def state(self) -> dict[str, Any]:
        """A snapshot for ``GET /v1/emulator/state``."""
        return {
            "iteration": self.k,
            "accepted": self.accepted,
            "resyncs": self.resyncs,
            "model_time_s": self.model_end,
            "wall_time_s": self.clock() - self.t0,
            "last_lateness_s": self.lateness_s,
            "ranks": [
                {
                    "rank": r.index,
                    "running": len(r.running),
                    "waiting": len(r.waiting),
                    "load": r.load,
                    "generation_tokens": r.metrics.generation_tokens,
                    "prompt_tokens": r.metrics.prompt_tokens,
                    "finished": dict(r.metrics.success),
                }
                for r in self.rank_states
            ],
        }

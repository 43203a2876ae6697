"""Discrete-iteration simulator of one synchronization group of ``G`` decode workers.

Timing of iteration ``k`` (docs/design.md, "Model and metrics"): requests whose last token was produced in
iteration ``k-1`` leave; every survivor grows by one token; released requests join the pool;
the policy admits. Loads after admission define the imbalance and, through the cost model,
the iteration's duration. Iterations with nothing to decide (no completion, no admission
possible) are advanced in one vectorized span. When the tier is empty and the pool is empty,
the clock jumps to the next release; such idle time is not an iteration.

Colocated prefill (``cost.t_prefill_s > 0``, ``router/lab/cost.py``): each worker computes the
prompts admitted to it first come first served, at most ``prefill_chunk_tokens`` a step, and
the step costs ``t_fixed + t_comm + max_g (t_token L_g + t_prefill P_g)``. A request emits its
first token in the step that computes its last prompt token, and none before; its KV load
counts its whole prompt from admission, as the routers count it. No span is taken while a
prompt is being computed.
"""

from __future__ import annotations

import heapq
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.sim_record import Recorder
from balanceroute.router.policies.admission import admission_violation
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.state import RouterState, RunningRequests

SPAN_LIMIT = 4096


class RoutingViolation(RuntimeError):
    """A policy decision broke an invariant (capacity, duplicates, maximality)."""


@dataclass(frozen=True, slots=True)
class SimConfig:
    """One synchronization group and how to run it."""

    workers: int = 8
    slots: int = 64
    cost: CostModel = field(default_factory=CostModel)
    seed: int = 0
    validate: bool = True
    record_loads: bool = True
    progress: bool = False
    max_iterations: int = 50_000_000


@dataclass(slots=True)
class SimResult:
    """Everything a run recorded; metrics are derived by ``router.metrics``."""

    config: SimConfig
    policy: dict[str, Any]
    imbalance: np.ndarray  # float64 (K,) after admission
    max_load: np.ndarray  # float64 (K,)
    total_load: np.ndarray  # float64 (K,)
    waiting: np.ndarray  # int64 (K,) pool size after admission
    t_start: np.ndarray  # float64 (K+1,) start time of each iteration; last = end of run
    loads: np.ndarray | None  # float64 (K, G) per-worker loads after admission
    release_s: np.ndarray  # per request, release order
    admit_iter: np.ndarray
    worker: np.ndarray
    overtaken: np.ndarray
    prompt_tokens: np.ndarray
    output_tokens: np.ndarray
    trace_index: np.ndarray
    router_ns: np.ndarray  # int64 per routing call
    sim_wall_s: float
    extras: dict[str, Any] = field(default_factory=dict)
    prefill_steps: np.ndarray | None = None  # int64 per request: steps before its first token's

    @property
    def iterations(self) -> int:
        return int(self.imbalance.shape[0])

    @property
    def admit_s(self) -> np.ndarray:
        return self.t_start[self.admit_iter]

    @property
    def first_iter(self) -> np.ndarray:
        """Iteration that emits each request's first token (its admission's, without prefill)."""
        return (
            self.admit_iter if self.prefill_steps is None else self.admit_iter + self.prefill_steps
        )

    @property
    def finish_s(self) -> np.ndarray:
        return self.t_start[self.first_iter + self.output_tokens]


class _SimPool:
    """The waiting pool as seen by a policy: positions in release order, oldest first."""

    def __init__(self, sim: DecodeSimulator) -> None:
        self.sim = sim
        self.size = 0
        self.span_hint = 0

    def head(self, n: int) -> np.ndarray:
        sim = self.sim
        lo, hi = sim.head, sim.released
        # Requests admitted out of order leave holes near the head; start from the span that
        # was needed last time so a step scans once.
        span = max(2 * n + 16, self.span_hint // 2)
        while True:
            end = min(hi, lo + span)
            idx = np.flatnonzero(~sim.admitted[lo:end])
            if idx.size >= n or end == hi:
                self.span_hint = span
                return idx[:n] + lo
            span *= 4

    def waited_iterations(self, positions: np.ndarray) -> np.ndarray:
        return self.sim.k - self.sim.release_iter[positions]

    def waited_seconds(self, positions: np.ndarray) -> np.ndarray:
        return self.sim.clock - self.sim.requests.release_s[positions]

    def overtaken(self, positions: np.ndarray) -> np.ndarray:
        return self.sim.overtaken[positions]


class DecodeSimulator:
    """Replays released requests through a policy; ``run()`` returns a :class:`SimResult`."""

    def __init__(self, requests: ReleasedRequests, policy: Policy, config: SimConfig) -> None:
        self.requests = requests
        self.policy = policy
        self.config = config
        n = requests.size
        self.admitted = np.zeros(n, dtype=bool)
        self.release_iter = np.full(n, -1, dtype=np.int64)
        self.overtaken = np.zeros(n, dtype=np.int64)
        self.admit_iter = np.full(n, -1, dtype=np.int64)
        self.worker_of = np.full(n, -1, dtype=np.int64)
        self.slot_of = np.full(n, -1, dtype=np.int64)
        self.prefill_steps = np.zeros(n, dtype=np.int64)
        self.prefills = config.cost.prefills
        self.k = 0
        self.clock = 0.0
        self.head = 0
        self.released = 0

    def running(self) -> RunningRequests:
        """Running requests right now (for policies that project loads)."""
        flat = self.slot_req.ravel()
        mask = flat >= 0
        pos = flat[mask]
        age = self.k - self.admit_iter[pos]
        if self.prefills:
            age = np.maximum(age - self.prefill_steps[pos], 0)
        prompts = self.requests.prompt_tokens[pos]
        return RunningRequests(
            position=pos,
            worker=np.flatnonzero(mask) // self.config.slots,
            workload=prompts + age,
            age=age,
            prompt_tokens=prompts,
        )

    def _violation(self, msg: str) -> RoutingViolation:
        return RoutingViolation(f"policy '{self.policy.name}' at iteration {self.k}: {msg}")

    def _validate(self, pos: list[int], wk: list[int], due: int, free: list[int]) -> None:
        head, released, admitted = self.head, self.released, self.admitted
        problem = admission_violation(
            pos,
            wk,
            due=due,
            free=free,
            maximal=self.maximal,
            waiting=lambda i: head <= i < released and not admitted[i],
        )
        if problem is not None:
            raise self._violation(problem)

    def _apply(
        self, pos_arr: np.ndarray, pos: list[int], wk: list[int], loads, active, free, heap
    ) -> None:
        k = self.k
        prompts = self.requests.prompt_tokens
        outputs = self.requests.output_tokens
        admitted, admit_iter, worker_of = self.admitted, self.admit_iter, self.worker_of
        slot_req, slot_of, stacks = self.slot_req, self.slot_of, self.free_stack
        prefills = self.prefills
        for i, g in zip(pos, wk, strict=True):
            b = stacks[g].pop()
            slot_req[g, b] = i
            slot_of[i] = b
            admitted[i] = True
            admit_iter[i] = k
            worker_of[i] = g
            loads[g] += int(prompts[i])
            active[g] += 1
            free[g] -= 1
            d = self._queue_prefill(i, g, int(prompts[i])) if prefills else 0
            heapq.heappush(heap, (k + d + int(outputs[i]), i))
        self.pool.size -= len(pos)
        lo = self.head
        if admitted[lo]:
            seg = admitted[lo : self.released]
            first = int(np.argmin(seg))
            self.head = self.released if seg[first] else lo + first
        top = max(pos)
        if top - lo >= len(pos):
            waiting = np.flatnonzero(~admitted[lo:top]) + lo
            if waiting.size:
                order = np.sort(pos_arr)
                self.overtaken[waiting] += order.size - np.searchsorted(order, waiting, "right")

    def run(self) -> SimResult:
        cfg = self.config
        rq = self.requests
        n, g_count, b_slots = rq.size, cfg.workers, cfg.slots
        rel = rq.release_s
        t_fixed = cfg.cost.t_fixed_s + cfg.cost.t_comm_s
        t_token = cfg.cost.t_token_s
        prefills = self.prefills
        self._reset()
        pool, maximal = self.pool, self.maximal
        # Per-worker state as plain lists: at G = 8 a list op costs a tenth of a numpy call.
        loads = [0] * g_count
        active = [0] * g_count
        decoding = self.decoding = [0] * g_count if prefills else active  # emitting, per worker
        free = [b_slots] * g_count
        heap: list[tuple[int, int]] = []
        rec = Recorder(g_count, cfg.record_loads)
        chunk = rec.CHUNK
        router_ns: list[int] = []
        hook_ns = 0  # completion-hook time, charged to the next routing call
        done = 0
        n_active = 0
        n_free = g_count * b_slots
        next_rel = float(rel[0]) if n else np.inf
        progress = _progress(cfg.progress, n, self.policy.name)
        wall0 = time.perf_counter()

        while done < n:
            k = self.k
            if k >= cfg.max_iterations:
                raise RuntimeError(f"simulation exceeded {cfg.max_iterations} iterations")
            if heap and heap[0][0] == k:
                finished, ns = self._complete(heap, loads, active, free)
                hook_ns += ns
                done += finished
                n_active -= finished
                n_free += finished
                self.policy.background(k)  # off the routing path: untimed
                if progress is not None:
                    progress.update(finished)
            loads = [x + a for x, a in zip(loads, decoding, strict=True)]
            if prefills and self.starts:
                self._start_decoding()
            if next_rel <= self.clock:
                next_rel = self._release()
            if n_active == 0 and pool.size == 0:
                if self.released >= n:
                    break
                self.clock = max(self.clock, next_rel)
                continue
            if pool.size > 0 and n_free > 0:
                admitted, ns = self._route(loads, active, free, heap, n_free, n_active)
                router_ns.append(ns + hook_ns)
                hook_ns = 0
                n_active += admitted
                n_free -= admitted
            j = rec.j
            rec.buf[j] = loads
            rec.wait[j] = pool.size
            rec.start[j] = self.clock
            if prefills and self.backlog_total:
                self.clock += self._prefill_step(loads)
            else:
                self.clock += t_fixed + t_token * max(loads)
            rec.j = j + 1
            if rec.j == chunk:
                rec.flush()
            self.k = k + 1
            if heap and maximal and (pool.size == 0 or n_free == 0):
                span = min(heap[0][0] - self.k, SPAN_LIMIT)
                if span > 1 and not (prefills and self.backlog_total):
                    arr = np.array(loads, dtype=np.float64)
                    emitting = np.array(decoding, dtype=np.float64)
                    self._advance_span(span, arr, emitting, n_free, rec)
                    loads = [int(x) for x in arr.tolist()]
                    next_rel = float(rel[self.released]) if self.released < n else np.inf
        if progress is not None:
            progress.close()
        return self._result(rec, router_ns, time.perf_counter() - wall0)

    def _reset(self) -> None:
        """The policy told about the run; every slot of every worker free, the pool empty."""
        cfg = self.config
        g_count, b_slots = cfg.workers, cfg.slots
        self.policy.reset(RunContext(g_count, b_slots, self.requests.table, seed=cfg.seed))
        self.maximal = bool(self.policy.maximal)
        self.slot_req = np.full((g_count, b_slots), -1, dtype=np.int64)
        self.free_stack = [list(range(b_slots - 1, -1, -1)) for _ in range(g_count)]
        self.pool = _SimPool(self)
        self.backlog = [0] * g_count  # prompt tokens admitted and not yet computed, per worker
        self.backlog_total = 0
        self.starts: list[tuple[int, int]] = []  # (iteration, worker): a prefill's last step

    def _queue_prefill(self, i: int, g: int, prompt: int) -> int:
        """Queue request ``i``'s prompt on worker ``g``; returns the steps before the one that
        emits its first token (the step computing its last prompt token)."""
        backlog = self.backlog[g] + prompt
        self.backlog[g] = backlog
        self.backlog_total += prompt
        d = -(-backlog // self.config.cost.prefill_chunk_tokens) - 1
        self.prefill_steps[i] = d
        if d:
            heapq.heappush(self.starts, (self.k + d, g))
        else:
            self.decoding[g] += 1
        return d

    def _start_decoding(self) -> None:
        """Requests whose last prompt chunk is computed in this step emit from now on."""
        starts, k = self.starts, self.k
        while starts and starts[0][0] <= k:
            self.decoding[heapq.heappop(starts)[1]] += 1

    def _prefill_step(self, loads: list[int]) -> float:
        """This step's duration with each worker's prompt chunk, which it computes."""
        cost = self.config.cost
        chunk, t_token, t_prefill = cost.prefill_chunk_tokens, cost.t_token_s, cost.t_prefill_s
        done = [min(chunk, b) for b in self.backlog]
        self.backlog = [b - x for b, x in zip(self.backlog, done, strict=True)]
        self.backlog_total -= sum(done)
        work = max(t_token * x + t_prefill * p for x, p in zip(loads, done, strict=True))
        return cost.t_fixed_s + cost.t_comm_s + work

    def _complete(self, heap, loads, active, free) -> tuple[int, int]:
        """Free the slots of the requests that finish at this iteration and tell the policy;
        returns how many finished and the nanoseconds the policy's hook took."""
        k = self.k
        prompts, outputs = self.requests.prompt_tokens, self.requests.output_tokens
        worker_of, slot_of, slot_req, stacks = (
            self.worker_of,
            self.slot_of,
            self.slot_req,
            self.free_stack,
        )
        fin = []
        while heap and heap[0][0] == k:
            i = heapq.heappop(heap)[1]
            fin.append(i)
            g = int(worker_of[i])
            b = int(slot_of[i])
            slot_req[g, b] = -1
            stacks[g].append(b)
            loads[g] -= int(prompts[i]) + int(outputs[i]) - 1
            active[g] -= 1
            if self.prefills:
                self.decoding[g] -= 1
            free[g] += 1
        fin_arr = np.asarray(fin, dtype=np.int64)
        t0 = time.perf_counter_ns()
        self.policy.on_complete(fin_arr, outputs[fin_arr], self.clock, k)
        return len(fin), time.perf_counter_ns() - t0

    def _release(self) -> float:
        """Requests whose release time has come join the pool; returns the next release time."""
        rel, n = self.requests.release_s, self.requests.size
        new = int(np.searchsorted(rel, self.clock, side="right"))
        self.release_iter[self.released : new] = self.k
        self.pool.size += new - self.released
        self.released = new
        return float(rel[new]) if new < n else np.inf

    def _route(self, loads, active, free, heap, n_free: int, n_active: int) -> tuple[int, int]:
        """One routing call and its admissions applied; returns how many it admitted and the
        nanoseconds the call took."""
        pool = self.pool
        due = min(pool.size, n_free)
        state = RouterState(
            iteration=self.k,
            time_s=self.clock,
            free_slots=np.array(free, dtype=np.int64),
            active=np.array(active, dtype=np.int64),
            pool=pool,
            requests=self.requests.table,
            running_source=self.running,
            loads_source=lambda: np.array(loads, dtype=np.float64),
        )
        t0 = time.perf_counter_ns()
        adm = self.policy.route(state)
        ns = time.perf_counter_ns() - t0
        pos = adm.positions.tolist()
        wk = adm.workers.tolist()
        if self.config.validate:
            self._validate(pos, wk, due, free)
        if pos:
            self._apply(adm.positions, pos, wk, loads, active, free, heap)
        elif n_active == 0:
            raise self._violation("admitted nothing into an empty tier: it would never run")
        return len(pos), ns

    def _result(self, rec: Recorder, router_ns: list[int], wall_s: float) -> SimResult:
        rq = self.requests
        out = rec.result(self.clock)
        return SimResult(
            config=self.config,
            policy=self.policy.describe(),
            imbalance=out["imb"],
            max_load=out["mx"],
            total_load=out["tot"],
            waiting=out["wait"],
            t_start=out["start"],
            loads=out["loads"],
            release_s=rq.release_s,
            admit_iter=self.admit_iter,
            worker=self.worker_of,
            overtaken=self.overtaken,
            prompt_tokens=rq.prompt_tokens,
            output_tokens=rq.output_tokens,
            trace_index=rq.table.trace_index,
            router_ns=np.asarray(router_ns, dtype=np.int64),
            sim_wall_s=wall_s,
            extras=dict(self.policy.run_stats()),
            prefill_steps=self.prefill_steps if self.prefills else None,
        )

    def _advance_span(self, span: int, loads, active, n_free: int, rec: Recorder) -> None:
        """Advance ``span`` iterations with no completion and nothing to admit, vectorized."""
        cost = self.config.cost
        rq = self.requests
        n = rq.size
        steps = np.arange(1, span + 1, dtype=np.float64)[:, None]
        path = loads[None, :] + steps * active[None, :]
        mx = path.max(axis=1)
        starts = self.clock + np.concatenate(
            ([0.0], np.cumsum(cost.t_fixed_s + cost.t_comm_s + cost.t_token_s * mx))
        )
        if self.released < n:
            first_rel = int(np.searchsorted(starts[:span], rq.release_s[self.released], "left"))
            if n_free > 0 and first_rel < span:
                span = first_rel
                if span == 0:
                    return
                path, mx = path[:span], mx[:span]
        waiting = np.full(span, self.pool.size, dtype=np.int64)
        if self.released < n:
            new = int(np.searchsorted(rq.release_s, starts[span - 1], side="right"))
            if new > self.released:
                it = np.searchsorted(starts[:span], rq.release_s[self.released : new], "left")
                self.release_iter[self.released : new] = self.k + it
                waiting += np.searchsorted(np.sort(it), np.arange(span), side="right")
                self.pool.size += new - self.released
                self.released = new
        rec.add_span(path, mx, waiting, starts[:span].copy())
        loads[:] = path[-1]
        self.clock = float(starts[span])
        self.k += span


def _progress(enabled: bool, total: int, name: str):
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="req", desc=f"simulate {name}", leave=False, disable=None)


def simulate(requests: ReleasedRequests, policy: Policy, config: SimConfig) -> SimResult:
    """Replay ``requests`` through ``policy`` on the group described by ``config``."""
    return DecodeSimulator(requests, policy, config).run()

"""Which of the live gateway's departures from the simulator's model move BR-H's imbalance ratio.

The simulator (``router/lab/simulator.py``) refills a slot in the very iteration after its
request's last token: the finish is known, the decision made and the request running at the
next iteration's start, all at once. Live (``bench -> gateway -> emulate``) each of those takes
time: the gateway hears the finish ``hear`` iterations after the last token, decides then (one
decision per batch of notices heard together), and the request reaches its rank ``send``
iterations after the decision, joining at the first iteration start after that (the emulator's
rule). Meanwhile the gateway's view keeps the finished request (its load and its slot) and
already holds the admitted one. This script replays the same released requests through the real
policies on the gateway's own state (:class:`~balanceroute.serving.gateway.state.LiveGroup`)
with those delays and records the engine's true per-rank loads, so each departure is measured
alone:

- ``hear`` / ``send``: constant lags in iterations (floats); ``jitter``: each notice's lag plus
  a uniform draw in ``[0, jitter)`` iterations (notices of one iteration heard apart, each its
  own decision: unbatched);
- ``age``: the view's ages off by this many tokens (negative: behind); ``period_error``: each
  rank's ages scaled by ``1 + e`` with ``e`` drawn once per rank from N(0, period_error) (a rank
  clock with the wrong period); ``warm``: every age is 1 until the gateway hears its first finish
  (the iteration clock's start);
- ``midstep``: a new request arrives at its time within an iteration (a decision then if a
  slot is free), not at the next iteration start (the simulator's);
- ``apart``: requests released together (a trace's equal timestamps: a burst) reach the gateway
  one at a time, each decided alone (live: bench sends them one after the other, and the
  gateway decides a request that arrives alone into a group with a free slot at once), not in
  one decision with the whole burst to choose from (the simulator's);
- ``spread``: a burst's requests reach the gateway evenly over this many iterations, in order
  (live: bench sends a burst within 3 ms, the gateway reads them over 13 ms at the median);
- ``hold``: the gateway's ``--hold`` in iterations: while requests run, a decision an event asks
  for waits this long and the events meanwhile join it (``hold_from``: only while at least
  this share of the slots is taken);
- ``barrier``: the gateway's ``--hold-step`` in iterations: while at least ``hold_from`` of the
  slots are taken, a decision an event asks for waits until this long before the iteration's
  end, the events meanwhile joining it (in place of ``hold``);
- ``zero``: with ``hear = send = 0``, ``zero=True`` is the simulator's model (decided and joined
  at the same iteration start), ``zero=False`` the emulator's floor: a request decided at an
  iteration start still joins at the next one.

The steady imbalance is ``G max - sum`` over iterations where the gateway's pool is non-empty
after its decisions (the simulator's definition); ``live_def`` also counts a rank's own queue.
With every lag 0 the replay is the simulator's, to the token; the spec ``direct`` sends each
request straight to rank ``i mod G`` (bench without a gateway), the emulator's own queueing: the
check that this model is the emulator's. ``--live RUN`` measures a live run instead: its lags in
iterations (:func:`live_lags`) and each of its admissions made again offline on the state
rebuilt from its logs (:func:`audit`).

    .venv/bin/python benchmarks/studies/lag_study.py --trace mooncake --windows 9 --seeds 60 \
        --arrival-jitter 0.02 > runs/lag_mooncake.json
    .venv/bin/python benchmarks/studies/lag_study.py --live runs/split/mooncake/x4-pfront-brh-none
"""

from __future__ import annotations

import argparse
import heapq
import json
import sys
from collections import deque
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.columns import canonical_columns
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.router.lab.cost import cost_preset
from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.policies.policy import RunContext
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.gateway.state import LiveGroup
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf"))
from live_gateway import COST, DATA, TRACES, B, G, rebased, released
from split_gateway import send_jittered

HEAR, ARRIVE, SEND = 0, 1, 2  # event kinds, in this order at equal times


@dataclass(frozen=True, slots=True)
class Lags:
    """The live departures from the simulator's model (module docstring)."""

    hear: float = 0.0
    send: float = 0.0
    jitter: float = 0.0
    age: int = 0
    zero: bool = True
    midstep: bool = False
    apart: bool = False
    spread: float = 0.0
    hold: float = 0.0
    hold_from: float = 0.0
    period_error: float = 0.0
    warm: bool = False
    barrier: float = 0.0
    seed: int = 0


@dataclass(frozen=True, slots=True)
class Drawn:
    """A live run's lags in iterations (:func:`live_lags`), drawn independently per request."""

    hear: np.ndarray
    send: np.ndarray

    def hear_lag(self, rng: np.random.Generator) -> float:
        return float(max(self.hear[rng.integers(self.hear.size)], 0.0))

    def send_lag(self, rng: np.random.Generator) -> float:
        return float(max(self.send[rng.integers(self.send.size)], 0.0))


@dataclass(slots=True)
class Run:
    """Per-iteration records of one replay: true loads after admission, the gateway's pool
    after its decisions, the ranks' own queues, idle slots."""

    loads: np.ndarray
    pool: np.ndarray
    rank_waiting: np.ndarray
    running: np.ndarray
    decisions: int
    admitted_per_decision: float

    def steady(self, live_def: bool = False) -> np.ndarray:
        mask = self.pool > 0
        return mask | (self.rank_waiting > 0) if live_def else mask

    def imbalance(self) -> np.ndarray:
        return self.loads.shape[1] * self.loads.max(axis=1) - self.loads.sum(axis=1)


def replay(rel: ReleasedRequests, spec: str, lags: Lags, drawn: Drawn | None = None) -> Run:
    """The requests through ``spec``'s policy on a gateway with ``lags`` (module docstring),
    or with each request's lags drawn from a live run's (``drawn``)."""
    cost = cost_preset(COST)
    t_fixed, t_token = cost.t_fixed_s + cost.t_comm_s, cost.t_token_s
    rng = np.random.default_rng(lags.seed)
    scale = 1.0 + rng.normal(0.0, lags.period_error, G) if lags.period_error > 0 else np.ones(G)
    heard_any = False
    n = rel.size
    same = np.r_[False, np.diff(rel.release_s) == 0]  # released with the one before: a burst
    start = np.maximum.accumulate(np.where(same, 0, np.arange(n)))
    size = np.bincount(start, minlength=n)[start]
    burst_pos = (np.arange(n) - start) / np.maximum(size, 1)  # 0 .. <1 within its burst
    group = LiveGroup.sized(G, B, n + 1)
    direct = spec == "direct"  # bench straight to the ranks, round-robin: no gateway
    policy = None if direct else RouterSpec.parse(spec).build_policy(None)
    if policy is not None:
        policy.reset(RunContext(G, B, group.table, seed=0))
    table_key = rel.table.prompt_key
    pos_of = np.full(n, -1, dtype=np.int64)  # request -> gateway position
    req_of: dict[int, int] = {}
    prompt, output = rel.prompt_tokens, rel.output_tokens
    # the engine: per rank its FCFS queue, running requests (id -> tokens so far) and load
    queue: list[list[int]] = [[] for _ in range(G)]
    running: list[dict[int, int]] = [{} for _ in range(G)]
    load = np.zeros(G, dtype=np.int64)
    generated = np.zeros(n, dtype=np.int64)
    rank_of = np.full(n, -1, dtype=np.int64)
    joining: list[tuple[int, int, int]] = []  # (join iteration, request, rank)
    events: list[tuple[float, int, int]] = []  # (time in iterations, kind, request)
    rows: dict[str, list[Any]] = {"loads": [], "pool": [], "wait": [], "run": []}
    decisions = admitted = 0
    k, clock, nxt = 0, 0.0, 0  # iteration, model time at its start, next release
    dur_prev: float | None = None  # the last iteration's duration (None after an idle spell)
    done = 0

    def decide(now_it: float) -> None:
        nonlocal decisions, admitted
        deps = group.take_departures()
        if deps:
            pos = np.array([d.position for d in deps], dtype=np.int64)
            out = np.array([d.output_tokens for d in deps], dtype=np.int64)
            policy.on_complete(pos, out, now_it, k)
            for d in deps:
                req_of.pop(d.position, None)
            group.release(deps)
        if not group.pool.size or not group.has_free_slot():
            return
        view = np.flatnonzero(group.rank >= 0)
        ids = np.array([req_of[int(p)] for p in view], dtype=np.int64)
        age = np.rint(generated[ids] * scale[group.rank[view]]).astype(np.int64) + lags.age
        if lags.warm and not heard_any:
            age = np.minimum(generated[ids], 1)
        group.age[view] = np.maximum(age, 0)
        state = group.snapshot(now_it)
        adm = policy.route(state)
        positions, ranks = adm.positions.tolist(), adm.workers.tolist()
        group.pool.passed(positions)
        decisions += 1
        admitted += len(positions)
        for p, g in zip(positions, ranks, strict=True):
            group.start(p, g)
            r = req_of[p]
            arrive_at = now_it + (lags.send if drawn is None else drawn.send_lag(rng))
            if lags.zero and lags.hear == 0 and lags.send == 0:
                join = int(np.ceil(arrive_at))
            else:
                join = int(np.floor(arrive_at)) + 1
            heapq.heappush(joining, (join, r, g))

    while done < n:
        # releases up to this iteration's start, at their fractional times in the last one
        while nxt < n and rel.release_s[nxt] <= clock:
            if dur_prev is not None and lags.midstep:
                frac = 1.0 - (clock - rel.release_s[nxt]) / dur_prev
                t = k - 1 + min(max(frac, 0.0), 1.0)
            else:
                t = float(k)
            if lags.apart:  # each its own decision, in release order
                t = t - 1e-6 * (n - nxt) / n
            if lags.spread > 0:  # a burst's requests reach the gateway one after the other
                t += lags.spread * float(burst_pos[nxt])
            heapq.heappush(events, (t, ARRIVE, nxt))
            nxt += 1
        # the gateway's events up to this iteration's start, in time order, one decision per time
        while events and events[0][0] <= k:
            t = events[0][0]
            busy = group.inflight.sum() >= lags.hold_from * G * B and group.inflight.any()
            if lags.barrier > 0 and busy:  # decided ``barrier`` before the step's end
                target = np.ceil(t) - lags.barrier
                t = target if target >= t else target + 1.0
                if t > k:
                    break
            elif lags.hold > 0 and busy:  # the first ask starts the hold
                t += lags.hold
                if t > k:
                    break  # decided during the next iteration
            group.iteration = int(np.floor(t))
            while events and events[0][0] <= t:
                _, kind, r = heapq.heappop(events)
                if kind == ARRIVE and direct:
                    heapq.heappush(joining, (int(np.floor(t)) + 1 if t > k - 1 else k, r, r % G))
                    continue
                if kind == ARRIVE:
                    p = group.arrive(int(prompt[r]), int(table_key[r]), t)
                    pos_of[r] = p
                    req_of[p] = r
                else:  # HEAR: the finish reaches the gateway
                    heard_any = True
                    group.leave(int(pos_of[r]), int(output[r]), learn=True)
            decide(t)
        # the engine's iteration k: joins, admission from the ranks' queues, loads
        while joining and joining[0][0] <= k:
            _, r, g = heapq.heappop(joining)
            queue[g].append(r)
        for g in range(G):
            while queue[g] and len(running[g]) < B:
                r = queue[g].pop(0)
                running[g][r] = 0
                rank_of[r] = g
                load[g] += int(prompt[r])
        idle = not any(running) and not group.pool.size and not any(queue)
        if idle and not joining and not events:
            if nxt >= n:
                break
            clock = max(clock, float(rel.release_s[nxt]))
            dur_prev = None
            continue
        rows["loads"].append(load.copy())
        rows["pool"].append(group.pool.size)
        rows["wait"].append(sum(len(q) for q in queue))
        rows["run"].append(sum(len(r) for r in running))
        dur_prev = t_fixed + t_token * float(load.max())
        clock += dur_prev
        # the iteration's end: one token each, finishes leave the engine, notices scheduled
        for g in range(G):
            if not running[g]:
                continue
            load[g] += len(running[g])
            gone = []
            for r in running[g]:
                generated[r] += 1
                if generated[r] >= output[r]:
                    gone.append(r)
            for r in gone:
                del running[g][r]
                load[g] -= int(prompt[r]) + int(generated[r])
                if direct:
                    done += 1
                    continue
                lag = lags.hear + (rng.uniform(0.0, lags.jitter) if lags.jitter > 0 else 0.0)
                if drawn is not None:
                    lag = drawn.hear_lag(rng)
                heapq.heappush(events, (k + 1 + lag, HEAR, r))
                done += 1
        k += 1
    return Run(
        loads=np.asarray(rows["loads"], dtype=np.float64),
        pool=np.asarray(rows["pool"]),
        rank_waiting=np.asarray(rows["wait"]),
        running=np.asarray(rows["run"]),
        decisions=decisions,
        admitted_per_decision=admitted / max(decisions, 1),
    )


def refill_gaps(rq: pd.DataFrame) -> np.ndarray:
    """Per request that joined a rank after a slot of it freed, the iterations that slot
    stood empty first (the simulator's model: 0 while requests wait): each rank's frees
    (the iteration after a request's last token) matched to its later joins, oldest first."""
    ran = rq[(rq["admit_iteration"] >= 0) & (rq["finish_reason"] != "abort")]
    gaps: list[int] = []
    for _, one in ran.groupby("worker"):
        admit = one["admit_iteration"].to_numpy()
        events = sorted([(int(a + n), 0) for a, n in zip(admit, one["generated"], strict=True)]
                        + [(int(a), 1) for a in admit])  # fmt: skip
        frees: deque[int] = deque()
        for k, kind in events:
            if kind == 0:
                frees.append(k)
            elif frees:
                gaps.append(k - frees.popleft())
    return np.asarray(gaps, dtype=np.int64)


def live_lags(run: Path) -> tuple[Drawn, dict[str, Any]]:
    """From one live run's folder (emulator and gateway logs): per request, iterations from
    the rank's last token to the gateway logging the finish (``hear``) and from the gateway's
    forward (its ``queue_delay_s``: the handler sending it, after the decision) to the rank
    receiving it (``send``), positions interpolated within the emulator's iterations; the
    refill gaps (:func:`refill_gaps`) in steady state; and the iterations from a request's
    arrival at its rank to its admission there."""
    epoch = json.loads((run / "emulator" / "config.json").read_text())["epoch"]
    iters, rq = read_log(run / "emulator")
    iters = iters.sort_values("iteration")
    starts = iters["start_s"].to_numpy()
    numbers = iters["iteration"].to_numpy()

    def pos(t: np.ndarray) -> np.ndarray:
        i = np.clip(np.searchsorted(starts, t, side="right") - 1, 0, starts.size - 2)
        span = np.maximum(starts[i + 1] - starts[i], 1e-9)
        return numbers[i] + np.clip((t - starts[i]) / span, 0.0, 1.0)

    comp = run / "gateway" / "completions"
    origin = json.loads((comp / "log.json").read_text())["origin_epoch_s"]
    gw = canonical_columns(
        pd.concat([pd.read_parquet(p) for p in sorted(comp.glob("part-*.parquet"))])
    )
    gw = gw.set_index("request_id")[["arrival_s", "queue_delay_s", "finish_s"]]
    done = rq[rq["finish_reason"] != "abort"].drop_duplicates("request_id", keep=False)
    both = done.set_index("request_id").join(gw.add_suffix("_gateway"), how="inner")
    forwarded = origin + both["arrival_s_gateway"] + both["queue_delay_s_gateway"] - epoch
    heard = origin + both["finish_s_gateway"] - epoch
    hear = pos(heard.to_numpy()) - pos(both["finish_s"].to_numpy())
    send = pos(both["recv_s"].to_numpy()) - pos(forwarded.to_numpy())
    wait = (both["admit_iteration"] - both["arrival_iter"]).to_numpy()
    busy = rank_matrix(iters, "running").sum(axis=1) >= 0.9 * G * B
    full_from = int(numbers[np.argmax(busy)]) if busy.any() else 0
    gaps = refill_gaps(rq[rq["admit_iteration"] >= full_from])
    summary = {
        "requests": len(both),
        "aborted": int((rq["finish_reason"] == "abort").sum()),
        "iteration_ms_p50": float(np.median(np.diff(starts)) * 1e3),
        "hear_iterations_p50_p90": np.percentile(hear, [50, 90]).round(2).tolist(),
        "send_iterations_p50_p90": np.percentile(send, [50, 90]).round(2).tolist(),
        "refill_gap_iterations_p50_p90_mean": [
            *np.percentile(gaps, [50, 90]).tolist(),
            float(gaps.mean()),
        ],
        "refill_gap_shares_0_1_2_3plus": [
            float((gaps == 0).mean()),
            float((gaps == 1).mean()),
            float((gaps == 2).mean()),
            float((gaps >= 3).mean()),
        ],
        "rank_queue_iterations_p50_p90": np.percentile(wait, [50, 90]).tolist(),
    }
    return Drawn(hear=np.maximum(gaps - 0.5, 0.0), send=np.zeros(1)), summary


def audit(run: Path, spec: str) -> dict[str, Any]:
    """Each of a live run's decisions made again offline by a fresh ``spec`` policy on the
    state rebuilt from the logs (the gateway's pool and its view: admitted requests count from
    their decision, finished ones until the gateway heard the finish, ages the engine's tokens
    by then), the live choice then applied so the state follows the live run: the share of
    decisions (and of admissions) the policy would have made the same way."""
    epoch = json.loads((run / "emulator" / "config.json").read_text())["epoch"]
    iters, rq = read_log(run / "emulator")
    ends = np.sort(iters["end_s"].to_numpy())
    comp = run / "gateway" / "completions"
    origin = json.loads((comp / "log.json").read_text())["origin_epoch_s"]
    parts = sorted(comp.glob("part-*.parquet"))
    gw = canonical_columns(pd.concat([pd.read_parquet(p) for p in parts]))
    gw = gw[gw["finish_reason"] != "abort"].reset_index(drop=True)
    emu = rq.drop_duplicates("request_id", keep=False).set_index("request_id")
    gw = gw[gw["request_id"].isin(emu.index)].reset_index(drop=True)
    admit_end = emu.loc[gw["request_id"], "admit_iteration"].to_numpy()
    first_end = np.searchsorted(np.sort(iters["iteration"].to_numpy()), admit_end)
    made = emu.loc[gw["request_id"], "generated"].to_numpy()
    decided = (gw["arrival_s"] + gw["queue_delay_s"]).to_numpy()
    events = sorted(
        [(t, 0, i) for i, t in enumerate(gw["arrival_s"].to_numpy())]
        + [(t, 1, i) for i, t in enumerate(gw["finish_s"].to_numpy())]
        + [(t, 2, i) for i, t in enumerate(np.round(decided, 6))]
    )
    group = LiveGroup.sized(G, B, len(gw) + 1)
    policy = RouterSpec.parse(spec).build_policy(None)
    policy.reset(RunContext(G, B, group.table, seed=0))
    pos = np.full(len(gw), -1, dtype=np.int64)
    req_of: dict[int, int] = {}
    prompts = gw["prompt_tokens"].to_numpy()
    ranks = gw["worker"].to_numpy()
    same = total = same_adm = total_adm = due_differs = 0
    misses: list[dict[str, Any]] = []
    j = 0
    while j < len(events):
        t, kind, i = events[j]
        if kind == 0:
            pos[i] = group.arrive(int(prompts[i]), 0, t)
            req_of[int(pos[i])] = i
            j += 1
            continue
        if kind == 1:
            group.leave(int(pos[i]), int(made[i]), learn=True)
            j += 1
            continue
        batch = []
        while j < len(events) and events[j][0] == t and events[j][1] == 2:
            batch.append(events[j][2])
            j += 1
        deps = group.take_departures()
        if deps:
            policy.on_complete(np.array([d.position for d in deps]),
                               np.array([d.output_tokens for d in deps]), t, 0)  # fmt: skip
            group.release(deps)
        view = np.flatnonzero(group.rank >= 0)
        ids = np.array([req_of[int(p)] for p in view], dtype=np.int64)
        emitted = np.searchsorted(ends, origin + t - epoch, side="right")
        group.age[view] = np.clip(emitted - first_end[ids], 0, made[ids])
        missing = [i for i in batch if int(pos[i]) not in group.pool.order]
        state = group.snapshot(t)
        live = {(int(pos[i]), int(ranks[i])) for i in batch if i not in missing}
        if state.admissions_due != len(batch) or missing:
            due_differs += 1
        if state.admissions_due > 0:
            adm = policy.route(state)
            mine = set(zip(adm.positions.tolist(), adm.workers.tolist(), strict=True))
            total += 1
            same += mine == live
            total_adm += len(live)
            same_adm += len(mine & live)
            if not live <= mine:
                misses.append(
                    {
                        "t": round(t, 3),
                        "pool": state.pool.size,
                        "due": state.admissions_due,
                        "live": sorted((int(prompts[req_of[p]]), g) for p, g in live),
                        "offline": sorted((int(prompts[req_of[p]]), g) for p, g in mine),
                        "free": state.free_slots.tolist(),
                        "loads_k": (state.loads / 1e3).round(0).tolist(),
                    }
                )
        group.pool.passed([int(pos[i]) for i in batch])
        for i in batch:
            if i not in missing:
                group.start(int(pos[i]), int(ranks[i]))
    return {
        "decisions": total,
        "same_decision_share": same / max(total, 1),
        "same_admission_share": same_adm / max(total_adm, 1),
        "decisions_with_other_due": due_differs,
        "misses": misses,
    }


def requests(trace: str, train: int, count: int, load: float) -> ReleasedRequests:
    """``split_gateway.py``'s replay: ``count`` requests after ``train``, at ``load``."""
    frame, _ = load_workload(WorkloadSpec(trace=str(DATA / TRACES[trace])))
    rel, _ = released(rebased(frame.iloc[train : train + count]), load)
    return rel


def figures(runs: dict[str, Run]) -> dict[str, Any]:
    """Steady imbalance of each router, BR-H's ratio, idle slots while waiting."""
    out: dict[str, Any] = {}
    for spec, run in runs.items():
        mask = run.steady()
        imb = run.imbalance()
        out[spec] = {
            "steady_imbalance": float(imb[mask].mean()) if mask.any() else None,
            "steady_iterations": int(mask.sum()),
            "steady_imbalance_live_def": float(imb[run.steady(True)].mean()),
            "idle_slots_while_waiting_p50": float(np.median(G * B - run.running[mask]))
            if mask.any()
            else None,
            "admitted_per_decision": round(run.admitted_per_decision, 2),
        }
    c, b = out.get("count-jsq"), out.get("brh:none")
    if c and b and c["steady_imbalance"]:
        out["ratio"] = b["steady_imbalance"] / c["steady_imbalance"]
    return out


# the lags measured live on Mooncake at x4 (hear 0.08 + U[0, 0.1), send 0.05 iterations)
MEASURED = Lags(hear=0.08, jitter=0.1, send=0.05, midstep=True)
GRID: dict[str, Lags] = {
    "simulator": Lags(),
    "arrivals within the iteration": Lags(midstep=True),
    "join one iteration later": Lags(zero=False),
    "hear 0.3": Lags(hear=0.3),
    "hear 1.3": Lags(hear=1.3),
    "hear 3.3": Lags(hear=3.3),
    "send 1.3": Lags(send=1.3),
    "send 3.3": Lags(send=3.3),
    "unbatched (hear U[0, 0.9))": Lags(jitter=0.9),
    "live-like quiet (hear 0.3 + U[0, 0.9), send 0.3)": Lags(
        hear=0.3, jitter=0.9, send=0.3, midstep=True
    ),
    "live-like loaded (hear 1 + U[0, 4), send 1.5)": Lags(
        hear=1.0, jitter=4.0, send=1.5, midstep=True
    ),
    "live-like slow (hear 3 + U[0, 6), send 3)": Lags(hear=3.0, jitter=6.0, send=3.0, midstep=True),
    "bursts apart": Lags(apart=True),
    "bursts apart + measured lags (hear 0.08 + U[0, 0.1), send 0.05)": replace(
        MEASURED, apart=True
    ),
    "measured lags, bursts together": MEASURED,
    "live (measured lags, bursts over 0.3)": replace(MEASURED, apart=True, spread=0.3),
    "live, hold 0.2": replace(MEASURED, apart=True, spread=0.3, hold=0.2),
    "live, hold 0.4": replace(MEASURED, apart=True, spread=0.3, hold=0.4),
    "live, hold 0.4 from half full": replace(
        MEASURED, apart=True, spread=0.3, hold=0.4, hold_from=0.5
    ),
    "live, bursts over 0.75": replace(MEASURED, apart=True, spread=0.75),
    "live, bursts over 0.75, hold 0.35 from half full": replace(
        MEASURED, apart=True, spread=0.75, hold=0.35, hold_from=0.5
    ),
    "live, bursts over 0.75, hold 0.7 from half full": replace(
        MEASURED, apart=True, spread=0.75, hold=0.7, hold_from=0.5
    ),
    "live, decided 0.1 before the step's end from half full": replace(
        MEASURED, apart=True, spread=0.3, barrier=0.1, hold_from=0.5
    ),
    "live, decided 0.25 before the step's end from half full": replace(
        MEASURED, apart=True, spread=0.3, barrier=0.25, hold_from=0.5
    ),
    "age -3": Lags(age=-3),
    "age +3": Lags(age=3),
    "rank periods off by N(0, 5%)": Lags(period_error=0.05),
    "rank periods off by N(0, 20%)": Lags(period_error=0.2),
    "ages 1 until the first finish": Lags(warm=True),
}
ROUTERS = ("count-jsq", "brh:none")


def geo_ci(x: np.ndarray, seed: int = 0) -> list[float]:
    """Geometric mean of ``x`` with a 95% bootstrap interval over its entries."""
    lx = np.log(x)
    rng = np.random.default_rng(seed)
    boot = lx[rng.integers(0, lx.size, (2000, lx.size))].mean(axis=1)
    return [float(np.exp(lx.mean())), *np.exp(np.percentile(boot, [2.5, 97.5])).tolist()]


def summarize(cases: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    """Per case over the windows: each router's steady imbalance over the simulator's (same
    window), BR-H's ratio over the simulator's; geometric means with 95% intervals."""
    base = cases["simulator"]
    out: dict[str, Any] = {}
    for name, per in cases.items():
        row: dict[str, Any] = {}
        for spec in ROUTERS:
            rel = np.array([w[spec]["steady_imbalance"] / b[spec]["steady_imbalance"]
                            for w, b in zip(per, base, strict=True)])  # fmt: skip
            row[f"{spec}_over_sim"] = geo_ci(rel)
        rr = np.array([w["ratio"] / b["ratio"] for w, b in zip(per, base, strict=True)])
        row["ratio_over_sim"] = geo_ci(rr)
        row["ratio_over_sim_per_window"] = [round(float(v), 3) for v in rr]
        row["ratio_per_window"] = [round(float(w["ratio"]), 4) for w in per]
        out[name] = row
    return out


def arrival_spread(rel: ReleasedRequests, jitter_s: float, seeds: int,
                   lags: Lags = Lags()) -> dict[str, Any]:  # fmt: skip
    """One case (the simulator itself by default) on ``seeds`` draws of arrival jitter (and of
    the case's own, seeded alike): how far one run's ratio moves from the simulator's point
    with nothing but send times a little off, and the draws' pooled ratio with its 95%
    interval (the draws resampled whole), the reference ``split_gateway.py --pool`` repeats
    compare with."""
    sim = figures({s: replay(rel, s, Lags()) for s in ROUTERS})
    out: dict[str, list[float]] = {"ratio": [], "count-jsq": [], "brh:none": []}
    steady: dict[str, list[float]] = {spec: [] for spec in ROUTERS}
    for seed in range(seeds):
        drawn = replace(lags, seed=seed)
        f = figures({s: replay(send_jittered(rel, jitter_s, seed), s, drawn) for s in ROUTERS})
        out["ratio"].append(f["ratio"] / sim["ratio"])
        for spec in ROUTERS:
            steady[spec].append(f[spec]["steady_imbalance"])
            out[spec].append(f[spec]["steady_imbalance"] / sim[spec]["steady_imbalance"])
    pooled = sum(steady["brh:none"]) / sum(steady["count-jsq"])
    pick = np.random.default_rng(1).integers(0, seeds, (2000, seeds))
    boot = np.array(steady["brh:none"])[pick].sum(1) / np.array(steady["count-jsq"])[pick].sum(1)
    return {
        "jitter_model_s": jitter_s,
        "sim_ratio": sim["ratio"],
        # the ratio of the draws' summed steady imbalances: the estimator split_gateway.py --pool
        # applies to live repeats, so the two compare like for like
        "pooled_ratio": round(pooled, 4),
        "pooled_ratio_ci95": np.percentile(boot, [2.5, 97.5]).round(4).tolist(),
        "pooled_ratio_over_sim": round(pooled / sim["ratio"], 3),
        "steady_imbalance_mean": {k: round(float(np.mean(v))) for k, v in steady.items()},
        **{
            f"{k}_over_sim_p10_p50_p90": np.percentile(v, [10, 50, 90]).round(3).tolist()
            for k, v in out.items()
        },
        "ratio_over_sim_share_over_1_5": float((np.array(out["ratio"]) > 1.5).mean()),
        "ratio_over_sim": [round(float(v), 3) for v in out["ratio"]],
    }


def seed_spread(rel: ReleasedRequests, lags: Lags, seeds: int) -> dict[str, Any]:
    """One window, one lag setting, ``seeds`` draws of the jitter: how far one run's ratio
    moves with nothing but the order of the finish notices."""
    sim = figures({s: replay(rel, s, Lags()) for s in ROUTERS})["ratio"]
    ratios = []
    for seed in range(seeds):
        lg = Lags(**{**asdict(lags), "seed": seed})
        ratios.append(figures({s: replay(rel, s, lg) for s in ROUTERS})["ratio"])
    r = np.array(ratios) / sim
    return {
        "sim_ratio": sim,
        "ratio_over_sim_p10_p50_p90": np.percentile(r, [10, 50, 90]).tolist(),
        "share_over_1_5": float((r > 1.5).mean()),
        "ratio_over_sim": [round(float(v), 3) for v in r],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trace", default="mooncake", choices=sorted(TRACES))
    p.add_argument("--train", type=int, default=3000, help="the first window's start")
    p.add_argument("--windows", type=int, default=1, help="windows of --requests, back to back")
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--load", type=float, default=1.1)
    p.add_argument("--cases", default="", help="names of GRID separated by ; (default all)")
    p.add_argument("--seeds", type=int, default=0, help="jitter draws on the first window")
    p.add_argument("--arrival-jitter", type=float, default=0.0,
                   help="model seconds: the simulator's spread under send-time jitter (with --seeds)")  # fmt: skip
    p.add_argument("--live", metavar="RUN",
                   help="instead: a live run's folder (split_gateway.py's x4-MODE-ROUTER): its lags "
                   "in iterations and the audit of its decisions (--router)")  # fmt: skip
    p.add_argument("--router", default="brh:none", help="the live run's router (with --live)")
    args = p.parse_args()
    if args.live:
        _, lags_seen = live_lags(Path(args.live))
        found = audit(Path(args.live), args.router)
        misses = found.pop("misses")
        print(json.dumps({"lags": lags_seen, "audit": found, "first_misses": misses[:20]},
                         indent=2, default=float))  # fmt: skip
        return
    names = [c for c in args.cases.split(";") if c] or list(GRID)
    if "simulator" not in names:
        names.insert(0, "simulator")
    result: dict[str, Any] = {"trace": args.trace, "requests": args.requests,
                              "windows": args.windows, "cases": {}}  # fmt: skip
    cases: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    first: ReleasedRequests | None = None
    for w in range(args.windows):
        rel = requests(args.trace, args.train + w * args.requests, args.requests, args.load)
        first = first or rel
        for name in names:
            lags = Lags(**{**asdict(GRID[name]), "seed": w})
            cases[name].append(figures({s: replay(rel, s, lags) for s in ROUTERS}))
        print("window", w, "done", file=sys.stderr, flush=True)
    result["first_window"] = {n: {"lags": asdict(GRID[n]), **c[0]} for n, c in cases.items()}
    result["summary"] = summarize(cases)
    if args.seeds and first is not None:
        result["seed_spread"] = {
            n: seed_spread(first, GRID[n], args.seeds) for n in names if GRID[n].jitter > 0
        }
    if args.seeds and args.arrival_jitter > 0 and first is not None:
        result["arrival_spread"] = {
            n: arrival_spread(first, args.arrival_jitter, args.seeds, GRID[n]) for n in names
        }
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()

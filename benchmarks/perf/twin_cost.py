"""The live twin's cost beside a decode group at real time (prints JSON).

A G = 8, B = 32 group (the default cost model: a step of about 60 ms) is emulated at real
time: the simulator replays the Azure conversation trace (its first 30% fits ``gbdt``, the
rest is replayed at ``--load`` times the decode capacity) and every routing call waits until
the wall clock reaches the step's model time, so the router, the twin's thread and the group
share the machine as in a service. BR-H routes with ``gbdt`` at a fixed blend weight ``w = 1``
(the heaviest step: every prediction is used), so the step does the same work whether the twin
runs or not. Passes alternate without and with the live twin (ABBA, ``--passes 4``): with it,
a :class:`~balanceroute.router.lab.twin.live.TwinWorker` thread runs one
:class:`~balanceroute.router.lab.twin.live.LiveTwin` fed as the gateway feeds it (arrivals,
finishes, the live iteration), at the default budget (``work_ratio`` 5 simulated iterations
per live iteration, and the thread capped at ``--cpu-share`` of one core: 4% by default);
its weight is reported, not applied.

Reported: the twin thread's CPU (``time.thread_time``) as a share of one core over each
pass's wall time (and from its first step on), its blocks judged, lag and dropped blocks, and
the router step p50 (calls with admissions due) of each pass, side by side, with the ratio of
the medians with and without the twin; the load average before and after (the machine is
shared).

    .venv/bin/python benchmarks/perf/twin_cost.py [--seconds 300] [--passes 4] [--load 1.0]
        [--work-ratio 5] [--cpu-share 0.04] [--steady-after 180]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.features.loaders import load_trace
from balanceroute.features.schema import to_arrays
from balanceroute.features.split import time_split
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.prefill import ReleasedRequests, rate_scale_for_load
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.live import LiveTwin, TwinWorker, pending_limit
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import RequestTable

DATA = Path(__file__).resolve().parents[3] / "shared" / "data"
G, B = 8, 32
SPEC = "brh:gbdt"


class RealTime(Policy):
    """Routes at real time: waits until the wall clock reaches the step's model time, times
    the inner routing call, and feeds a live twin (when one runs) as a gateway does."""

    def __init__(self, inner: Policy, released, twin_worker: TwinWorker | None) -> None:
        self.inner = inner
        self.name = inner.name
        self.maximal = inner.maximal
        self.released = released
        self.worker = twin_worker
        self.steps_ns: list[int] = []
        self.steps_at: list[float] = []  # wall seconds since the pass began
        self.tickets = np.full(released.size, -1, dtype=np.int64)
        self.next_release = 0
        self.start = 0.0
        self.channel = None if twin_worker is None else twin_worker.channels["live"]
        self.first_step: tuple[float, float] | None = None  # (wall, twin CPU) at its first step

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.inner.set_blend(1.0)
        self.start = time.monotonic()

    def route(self, state):
        wait = self.start + state.time_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        if self.channel is not None:
            feed, rq = self.channel.feed, self.released
            while self.next_release < rq.size and rq.release_s[self.next_release] <= state.time_s:
                i = self.next_release
                self.tickets[i] = feed.arrived(
                    float(rq.release_s[i]),
                    int(rq.table.prompt_tokens[i]),
                    int(rq.table.prompt_key[i]),
                )
                self.next_release += 1
            feed.tick(state.iteration)
            job = self.channel.job("twin")
            if self.first_step is None and job is not None and job.steps:
                self.first_step = (time.monotonic(), self.worker.cpu_s)
        t0 = time.perf_counter_ns()
        adm = self.inner.route(state)
        if state.admissions_due > 0:
            self.steps_ns.append(time.perf_counter_ns() - t0)
            self.steps_at.append(time.monotonic() - self.start)
        return adm

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.inner.on_complete(positions, output_tokens, finish_s, iteration)
        if self.channel is not None:
            for p, out in zip(positions.tolist(), np.asarray(output_tokens).tolist(), strict=True):
                if self.tickets[p] >= 0:
                    self.channel.feed.finished(int(self.tickets[p]), int(out), float(finish_s))


def head(released: ReleasedRequests, seconds: float) -> ReleasedRequests:
    """The requests released in the first ``seconds``."""
    n = int(np.searchsorted(released.release_s, seconds, side="right"))
    t = released.table
    return ReleasedRequests(
        released.release_s[:n],
        released.prompt_tokens[:n],
        released.output_tokens[:n],
        RequestTable(t.prompt_tokens[:n], t.prompt_key[:n], np.arange(n, dtype=np.int64)),
    )


def one_pass(
    estimator,
    released,
    seconds: float,
    twin: bool,
    work_ratio: float,
    steady_s: float,
    cpu_share: float | None,
) -> dict[str, Any]:
    """One pass of ``seconds`` at real time; the step times and the twin's figures."""
    spec = RouterSpec.parse(SPEC)
    policy = spec.build_policy(copy.deepcopy(estimator))
    cfg = TwinConfig(work_ratio=work_ratio, cpu_share=cpu_share)
    worker = None
    if twin:
        worker = TwinWorker(cpu_share=cfg.cpu_share)
        channel = worker.channel("live", pending_limit(cfg, G, B))
        group = TwinGroup(spec, G, B, CostModel())
        channel.add("twin", lambda: LiveTwin(group, estimator, cfg))
        worker.start()
    # the pass replays the requests released in its first ``seconds`` (then drains)
    part = head(released, seconds)
    wrapped = RealTime(policy, part, worker)
    wall0 = time.monotonic()
    simulate(part, wrapped, SimConfig(workers=G, slots=B, cost=CostModel(), validate=False))
    wall = time.monotonic() - wall0
    steps = np.asarray(wrapped.steps_ns) / 1e3
    late = steps[np.asarray(wrapped.steps_at) >= steady_s]
    out: dict[str, Any] = {
        "twin": twin,
        "wall_s": round(wall, 1),
        "requests": part.size,
        "router_step_p50_us": round(float(np.median(steps)), 1) if steps.size else None,
        "router_step_p99_us": round(float(np.percentile(steps, 99)), 1) if steps.size else None,
        "routing_calls": int(steps.size),
        # the calls from steady_s on: when the twin has blocks to replay in the passes with it
        "router_step_p50_us_late": round(float(np.median(late)), 1) if late.size else None,
        "routing_calls_late": int(late.size),
    }
    if worker is not None:
        end = (time.monotonic(), worker.cpu_s)
        worker.stop()
        first = wrapped.first_step
        if first is not None and end[0] > first[0]:
            out["twin_core_share_from_first_step"] = round(
                (end[1] - first[1]) / (end[0] - first[0]), 4
            )
            out["twin_first_step_at_s"] = round(first[0] - wall0, 1)
        job = worker.channels["live"].job("twin")
        stats = job.stats() if job is not None else {}
        out.update(
            twin_cpu_s=round(worker.cpu_s, 3),
            twin_core_share=round(worker.cpu_s / wall, 4),
            twin_blocks_judged=stats.get("twin_decisions"),
            twin_blocks_dropped=stats.get("twin_blocks_dropped"),
            twin_lag_blocks=stats.get("twin_lag_blocks"),
            twin_weight=stats.get("twin_weight"),
            twin_iterations=stats.get("twin_iterations"),
            twin_cpu_s_in_steps=stats.get("twin_cpu_s"),
            twin_capped_passes=worker.capped_passes,
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=300.0, help="wall seconds per pass")
    ap.add_argument("--passes", type=int, default=4, help="ABBA passes: without, with, ...")
    ap.add_argument("--load", type=float, default=1.0, help="times the decode capacity")
    ap.add_argument(
        "--work-ratio",
        type=float,
        default=TwinConfig().work_ratio,
        help="the twin's budget: simulated iterations per live iteration",
    )
    ap.add_argument(
        "--cpu-share",
        type=float,
        default=TwinConfig().cpu_share,
        help="the twin thread's cap, share of one core (0: no cap)",
    )
    ap.add_argument(
        "--steady-after",
        type=float,
        default=180.0,
        help="router step p50 also over the calls from this many seconds on",
    )
    args = ap.parse_args()
    azure = DATA / "azure_llm_2023_conv.csv"
    frame = load_trace(azure) if azure.exists() else generate("azure-conv", 20_000, seed=0)
    history, replay = time_split(frame, 0.3, rebase_tail=True)
    estimator = build_estimator(EstimatorSpec("gbdt"), history=history)
    arrays = to_arrays(replay)
    scale = rate_scale_for_load(arrays, args.load, G, B, CostModel())
    released = ReleasedRequests(  # released at the scaled arrival times (no prefill tier)
        release_s=(arrays.arrival_s - arrays.arrival_s[0]) / scale,
        prompt_tokens=arrays.prompt_tokens,
        output_tokens=arrays.output_tokens,
        table=RequestTable(
            arrays.prompt_tokens, arrays.prompt_key, np.arange(len(replay), dtype=np.int64)
        ),
    )
    load_before = os.getloadavg()
    order = [False, True, True, False] * (args.passes // 4 + 1)
    cap = args.cpu_share or None
    passes = [
        one_pass(estimator, released, args.seconds, twin, args.work_ratio, args.steady_after, cap)
        for twin in order[: args.passes]
    ]
    with_twin = [p["router_step_p50_us"] for p in passes if p["twin"]]
    without = [p["router_step_p50_us"] for p in passes if not p["twin"]]
    late_with = [p["router_step_p50_us_late"] for p in passes if p["twin"]]
    late_without = [p["router_step_p50_us_late"] for p in passes if not p["twin"]]
    shares = [p["twin_core_share"] for p in passes if p["twin"]]
    print(
        json.dumps(
            {
                "group": {"G": G, "B": B, "cost": "default (about 60 ms a step)"},
                "router": SPEC + " at w = 1 (fixed)",
                "twin_budget_work_ratio": args.work_ratio,
                "twin_cpu_share_cap": args.cpu_share or None,
                "load": args.load,
                "seconds_per_pass": args.seconds,
                "loadavg_before": [round(x, 2) for x in load_before],
                "loadavg_after": [round(x, 2) for x in os.getloadavg()],
                "passes": passes,
                "router_step_p50_us_without_twin": statistics.median(without) if without else None,
                "router_step_p50_us_with_twin": statistics.median(with_twin) if with_twin else None,
                "router_step_p50_ratio_with_to_without": round(
                    statistics.median(with_twin) / statistics.median(without), 4
                )
                if with_twin and without
                else None,
                "router_step_p50_late_ratio_with_to_without": round(
                    statistics.median(late_with) / statistics.median(late_without), 4
                )
                if late_with and late_without and None not in late_with + late_without
                else None,
                # noise floor: the two passes of one condition, larger over smaller
                "router_step_p50_spread_without": round(max(without) / min(without), 4)
                if len(without) > 1
                else None,
                "router_step_p50_spread_with": round(max(with_twin) / min(with_twin), 4)
                if len(with_twin) > 1
                else None,
                "twin_core_share_median": statistics.median(shares) if shares else None,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()

"""The gateway's decision at a lone arrival, in process, as JSON: what a request waits for between
its body being checked and its forward at low load (``Decider.admit``: the pool, the snapshot, the
policy, the checks), and a finish's bookkeeping (``Decider.finished``), per router.

The decider of ``balanceroute gateway`` (G = 8, B = 32) with ``--running`` requests on the ranks;
each arrival is decided at once (a free slot, nobody waiting) and the oldest running request
finishes after it. Figures are the medians over ``--arrivals`` (the first 200 dropped), one
router after the other ``--runs`` times; run it with another installation's python for the
figures before a change (the same script, side by side on a quiet machine). It times the hot
path unless ``--evict-mib`` writes that many MiB before every timed call (48 clears this
machine's caches): live, the same code runs several times slower between relayed tokens (cold
caches, a shared core), which ``side_by_side.py`` measures.

    .venv/bin/python benchmarks/perf/arrival_decision.py --routers count-jsq,brh:none
    .venv/bin/python benchmarks/perf/arrival_decision.py --routers count-jsq,brh --evict-mib 48 --arrivals 1200
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time

import numpy as np

from balanceroute.serving.gateway.decider import Decider
from balanceroute.serving.gateway.runtime import build_gateway
from balanceroute.serving.gateway.settings import GatewaySettings

DROP = 200


async def one_run(router: str, running: int, arrivals: int,
                  evict: np.ndarray | None = None) -> tuple[float, float]:  # fmt: skip
    """Median microseconds of an admission and of a finish (``evict`` written before each)."""
    ranks = [f"http://127.0.0.1:{9000 + g}" for g in range(8)]
    gw = build_gateway(GatewaySettings(ranks=ranks, slots=32, router=router))
    decider = Decider(gw)
    live: list[tuple[int, int, float]] = []
    admit_ns, finish_ns = [], []
    for i in range(arrivals):
        if evict is not None:
            evict[::64] += 1  # one write a cache line
        t0 = time.perf_counter_ns()
        rid, fut = decider.admit(1200, 12345 + i, "key", f"r{i}", True)
        admit_ns.append(time.perf_counter_ns() - t0)
        if not fut.done():
            raise RuntimeError(f"{router}: a lone arrival was not decided at once")
        now = gw.clock()
        decider.first_token(rid, now)
        live.append((rid, fut.result(), now))
        if len(live) > running:
            old, rank, first = live.pop(0)
            if evict is not None:
                evict[::64] += 1
            t0 = time.perf_counter_ns()
            decider.finished(old, rank, first, gw.clock(), 50, 1200, "stop")
            finish_ns.append(time.perf_counter_ns() - t0)
        await asyncio.sleep(0)  # the deferred bookkeeping runs, as in the gateway's loop
    return (statistics.median(admit_ns[DROP:]) / 1e3,
            statistics.median(finish_ns[DROP:]) / 1e3)  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="count-jsq,brh:none")
    p.add_argument("--running", type=int, default=5, help="requests running on the ranks")
    p.add_argument("--arrivals", type=int, default=3000)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--evict-mib", type=int, default=0, help="MiB written before each timed call")
    args = p.parse_args()
    evict = np.zeros(args.evict_mib << 20, dtype=np.uint8) if args.evict_mib > 0 else None
    routers = [r for r in args.routers.split(",") if r]
    if args.arrivals <= DROP:
        p.error(f"--arrivals must be above {DROP}")
    load0 = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {r: [] for r in routers}
    for _ in range(args.runs):
        for r in routers:
            runs[r].append(asyncio.run(one_run(r, args.running, args.arrivals, evict)))
    out = {}
    for r, v in runs.items():
        out[r] = {
            "admit_us_p50": round(statistics.median(a for a, _ in v), 1),
            "finished_us_p50": round(statistics.median(f for _, f in v), 1),
            "admit_us_runs": [round(a, 1) for a, _ in v],
        }
    print(json.dumps({"routers": out, "running": args.running, "arrivals": args.arrivals,
                      "evict_mib": args.evict_mib,
                      "loadavg_before": load0, "loadavg_after": os.getloadavg()}, indent=1))  # fmt: skip


if __name__ == "__main__":
    main()

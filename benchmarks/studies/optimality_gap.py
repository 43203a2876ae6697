"""Per-step optimality gap of BR-0 and BR-H against the exact ``IO_H`` MILP (prints JSON).

States are sampled from real replays (saturated, G=8, B=32): at every ``--every``-th routing
call with something to admit, the projected loads the policy scored against, the free slots and
its candidate window are recorded with its decision; the MILP then solves the same step over
the same candidates (maximal admission, the true discounted imbalance ``beta = G``). The gap is
``(objective(heuristic) - objective(optimum)) / objective(before admission)``, so 0 means
optimal and the scale is comparable across steps. Per-step optimality is not long-run
optimality: ``benchmarks/theory.py`` compares long-run means.

    .venv/bin/python benchmarks/optimality_gap.py [--states 60] [--every 25]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
from common import WORKLOADS, workload_frame

from balanceroute.predict.oracle import OracleEstimator
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, released_requests
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.balance_route import BR0Policy, BRHPolicy, PaperBRHPolicy
from balanceroute.router.policies.exact import solve_step, step_objective
from balanceroute.router.policies.policy import Policy
from balanceroute.router.policies.state import Admissions, RouterState


class Recorder(Policy):
    """Delegates to ``inner`` and records sampled steps for the exact solver."""

    def __init__(self, inner, every: int, limit: int) -> None:
        self.inner = inner
        self.name = inner.name
        self.every = every
        self.limit = limit
        self.samples: list[dict] = []
        self.calls = 0

    def reset(self, ctx) -> None:
        self.inner.reset(ctx)
        self.calls = 0

    def on_complete(self, *args) -> None:
        self.inner.on_complete(*args)

    def route(self, state: RouterState) -> Admissions:
        self.calls += 1
        take = (
            self.calls % self.every == 0
            and len(self.samples) < self.limit
            and state.admissions_due > 0
        )
        if take:
            cfg = self.inner.config
            gamma = self.inner.gamma
            cand = state.pool.head(state.admissions_due + max(cfg.window, cfg.r_max))
            loads = self.inner.projected_loads(
                state, state.requests.prompt_tokens[cand].astype(float)
            )
        adm = self.inner.route(state)
        if take:
            where = {int(p): j for j, p in enumerate(cand.tolist())}
            self.samples.append(
                {
                    "loads": loads,
                    "free": state.free_slots.copy(),
                    "prompts": state.requests.prompt_tokens[cand].astype(float),
                    "chosen": [where[int(p)] for p in adm.positions.tolist()],
                    "workers": adm.workers.tolist(),
                    "gamma": gamma,
                }
            )
        return adm


def gaps(samples: list[dict]) -> dict:
    rel, optimal, timeouts = [], 0, 0
    for s in samples:
        before = step_objective(s["loads"], s["prompts"], [], [], s["gamma"])
        heur = step_objective(s["loads"], s["prompts"], s["chosen"], s["workers"], s["gamma"])
        sol = solve_step(s["loads"], s["free"], s["prompts"], gamma=s["gamma"], time_limit_s=20)
        timeouts += not sol.optimal
        g = (heur - sol.objective) / max(before, 1.0)
        rel.append(g)
        optimal += g <= 1e-9
    rel = np.asarray(rel)
    return {
        "states": len(rel),
        "optimal_share": round(optimal / max(1, len(rel)), 3),
        "gap_median": float(np.median(rel)),
        "gap_p90": float(np.percentile(rel, 90)),
        "gap_max": float(rel.max()),
        "solver_timeouts": timeouts,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=60)
    ap.add_argument("--every", type=int, default=25)
    ap.add_argument("--workloads", default=",".join(WORKLOADS))
    args = ap.parse_args()
    out = {}
    for wl in args.workloads.split(","):
        frame = workload_frame(wl, 0)
        spec = ReplaySpec(workers=8, slots=32, prefill=PrefillConfig(saturate=True))
        rq, _ = released_requests(frame, spec)
        arms = {
            "br0": BR0Policy(),
            "brh-oracle": BRHPolicy(estimator=OracleEstimator().fit(frame)),
            "brh-paper-oracle": PaperBRHPolicy(estimator=OracleEstimator().fit(frame)),
        }
        out[wl] = {}
        for name, inner in arms.items():
            rec = Recorder(inner, args.every, args.states)
            simulate(rq, rec, SimConfig(workers=8, slots=32, record_loads=False))
            out[wl][name] = gaps(rec.samples)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()

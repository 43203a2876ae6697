"""When does the twin decide? Runs the twin over a trace's replayed part (after the A/B's 30%
training split, G = 8, B = 32, at a load) under a few block overlaps and minimum block counts,
and prints from which arrival on each switch is known (issue 19).

    .venv/bin/python benchmarks/studies/twin_decision_delay.py TRACE ARM LOAD
    e.g. ../shared/data/azure_llm_2023_conv.csv brh:survival 1.1
"""

from __future__ import annotations

import sys
import time

from balanceroute.features.loaders import load_trace
from balanceroute.features.split import time_split
from balanceroute.predict.factory import build_estimator
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, released_requests
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.schedule import twin_schedule
from balanceroute.router.policies.specs import RouterSpec


def main() -> None:
    trace, arm, load = sys.argv[1], sys.argv[2], float(sys.argv[3])
    frame = load_trace(trace)
    history, rep = time_split(frame, 0.3, rebase_tail=True)
    spec = RouterSpec.parse(arm)
    est = build_estimator(spec.estimator, history=history, replay=rep, horizon=80)
    rs = ReplaySpec(
        router=spec, workers=8, slots=32, prefill=PrefillConfig(saturate=False), load=load
    )
    rel, _ = released_requests(rep, rs)
    group = TwinGroup(spec, 8, 32)
    for ov, mw in ((2, 6), (4, 6), (4, 4), (2, 3)):
        t0 = time.time()
        entries, st = twin_schedule(group, est, rel, TwinConfig(overlap=ov, min_windows=mw))
        sw = [
            (e.known_from, e.weight)
            for i, e in enumerate(entries)
            if i == 0 or e.weight != entries[i - 1].weight
        ]
        print(
            ov,
            mw,
            "n",
            rel.size,
            "switches",
            sw,
            st["twin_mean_log_ratios"],
            round(time.time() - t0),
            flush=True,
        )


if __name__ == "__main__":
    main()

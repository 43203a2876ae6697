"""The learning loop shown live: drift detected, a retrain promoted and swapped in, quality back.

The ``azure-drift`` preset (azure-conv until the change, then each template's outputs spread 4x
wider) is cut in three: ``--history`` blocks of ``8 G B`` requests before the change fit the first
champion (``balanceroute pipeline --once`` on them, prompt keys as the gateway derives them from
the live prompts); then ``--before`` blocks and ``--after`` blocks around the change are replayed
by ``balanceroute bench`` at ``--load`` times the decode capacity, in real time, through
``balanceroute gateway --estimator gbdt@models:/completion-predictor@champion`` (router ``brh``,
the live twins on, the live quality window one block) in front of ``balanceroute emulate``
(G x B, ``paper-dsv3``), while ``balanceroute pipeline --loop`` retrains ``gbdt`` on the last
``--window`` blocks of the gateway's completion log every ``--period`` (once a block is new) and
reloads the gateway on a promotion.

Every ``--poll`` seconds ``/metrics`` gives the live Brier and drift of each model version, the
twin's weight, the pool and the reloads. Printed as JSON: the timeline, the change and each
promotion, and issue 33's targets: the drift gauge of the model serving at the change above 1.25
within 2 blocks of finished requests after it; the live Brier of the last version promoted
after the change within 10% of its holdout Brier (its drift gauge at most 1.10 once a block of
its requests finished); no request lost or failed (bench and the completion log). Per version:
when it first admitted, its last drift reading. ``OUT/timeline.png`` plots drift and twin weight.

    .venv/bin/python benchmarks/perf/learning_loop.py --out runs/learning_loop > runs/learning_loop.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from live_gateway import CLI, rebased, with_live_keys
from prometheus_client.parser import text_string_to_metric_families

from balanceroute.features.synthetic import generate, get_preset
from balanceroute.features.trace_io import write_trace
from balanceroute.serving.testbed.harness import ServerProcess, clean_env

DRIFT_LIMIT, RECOVERED = 1.25, 1.10
QUALITY = {"balanceroute_live_brier": "brier", "balanceroute_prediction_drift": "drift",
           "balanceroute_live_window_requests": "window"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Plan:
    """The group, the blocks and the processes' ports."""

    ranks: int
    slots: int
    history: int
    before: int
    after: int
    load: float
    period_s: float
    poll_s: float
    port: int
    time_scale: float = 1.0
    window: int = 4  # blocks a pipeline cycle reads

    @property
    def block(self) -> int:
        return 8 * self.ranks * self.slots


def workload(plan: Plan) -> tuple[pd.DataFrame, pd.DataFrame, int]:
    """History rows (live keys), the live rows (rebased) and the live row where the law changes."""
    blocks = plan.history + plan.before + plan.after
    preset = get_preset("azure-drift")
    at = (plan.history + plan.before) / blocks
    preset = dataclasses.replace(preset, drift=dataclasses.replace(preset.drift, at=at))
    frame = generate(preset, blocks * plan.block, seed=0)
    cut = plan.history * plan.block
    # bench builds each prompt from the trace's key; the history gets the key the gateway derives
    return with_live_keys(frame.iloc[:cut]), rebased(frame.iloc[cut:]), plan.before * plan.block


def scrape(url: str) -> dict[str, Any]:
    """The gauges the timeline keeps, from one ``/metrics`` page."""
    text = httpx.get(url + "/metrics", timeout=5.0, trust_env=False).text
    row: dict[str, Any] = {"t": time.time(), "versions": {}, "twin_weight": {}, "reloads": {}}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name in QUALITY:
                v = row["versions"].setdefault(s.labels.get("version", ""), {})
                v[QUALITY[s.name]] = s.value
            elif s.name == "balanceroute_gateway_twin_weight":
                row["twin_weight"][s.labels["arm"]] = s.value
            elif s.name == "balanceroute_gateway_twin_blocks":
                row["twin_blocks"] = s.value
            elif s.name == "balanceroute_gateway_reloads_total":
                row["reloads"][s.labels["outcome"]] = s.value
            elif s.name == "balanceroute_gateway_pool_size":
                row["pool"] = s.value
    return row


def poll(url: str, every_s: float, stop: threading.Event, out: list[dict[str, Any]]) -> None:
    while not stop.wait(every_s):
        try:
            out.append(scrape(url))
        except httpx.HTTPError as exc:
            print(f"poll failed: {exc}", file=sys.stderr)


def run(plan: Plan, work: Path, history: pd.DataFrame, live: pd.DataFrame) -> list[dict]:
    """The group, the gateway, bench and the pipeline loop; the polled timeline."""
    env = clean_env({"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}",
                     "BALANCEROUTE_QUALITY_WINDOW": str(plan.block)})  # fmt: skip
    write_trace(history, work / "history.parquet")
    write_trace(live, work / "live.parquet")
    shape = ["--group", f"{plan.ranks}x{plan.slots}", "--estimators", "gbdt"]
    first = [
        *CLI,
        "pipeline",
        "--once",
        "--log",
        str(work / "history.parquet"),
        *shape,
        "--min-new-rows",
        "1",
    ]
    ServerProcess(first, log=work / "pipeline-first.log", env=env, cwd=work).proc.wait()
    base = plan.port + 1
    emu = ServerProcess([*CLI, "emulate", "--ranks", str(plan.ranks), "--slots", str(plan.slots),
                         "--port-base", str(base), "--time-scale", str(plan.time_scale)], log=work / "emulator.log", env=env)  # fmt: skip
    ranks = [f"http://127.0.0.1:{base + g}" for g in range(plan.ranks)]
    procs = [emu]
    try:
        emu.wait_ready([u + "/health" for u in ranks], timeout_s=120)
        url = f"http://127.0.0.1:{plan.port}"
        gw_args = [*CLI, "gateway", "--slots", str(plan.slots), "--port", str(plan.port),
                   "--estimator", "gbdt@models:/completion-predictor@champion",
                   "--out", str(work / "gateway")] + [a for u in ranks for a in ("--rank", u)]  # fmt: skip
        gw = ServerProcess(gw_args, log=work / "gateway.log", env=env, cwd=work)
        procs.append(gw)
        gw.wait_ready([url + "/readyz"], timeout_s=180)
        loop = [*CLI, "pipeline", "--loop", f"{plan.period_s:g}s", "--log",
                str(work / "gateway" / "completions"), "--gateway", url, *shape,
                "--window-rows", str(plan.window * plan.block), "--min-new-rows", str(plan.block)]  # fmt: skip
        procs.append(ServerProcess(loop, log=work / "pipeline.log", env=env, cwd=work))
        timeline: list[dict[str, Any]] = []
        stop = threading.Event()
        poller = threading.Thread(target=poll, args=(url, plan.poll_s, stop, timeline))
        poller.start()
        bench = [*CLI, "bench", "--url", url, "--trace", str(work / "live.parquet"),
                 "--load", str(plan.load), "--ranks", str(plan.ranks), "--slots",
                 str(plan.slots), "--time-scale", str(plan.time_scale), "--out", str(work / "bench"),
                 "--no-progress"]  # fmt: skip
        ServerProcess(bench, log=work / "bench.log", env=env).proc.wait()
        time.sleep(2 * plan.poll_s)
        stop.set()
        poller.join()
        return timeline
    finally:
        for p in reversed(procs):
            p.terminate(60.0)


def outcomes(work: Path, live: pd.DataFrame, change_row: int) -> tuple[pd.DataFrame, float]:
    """The completion log joined to bench's rows (live trace index), on the wall clock; and when
    the first request after the change arrived. Raises if the gateway derived other prompt keys
    than the history was given (the first champion would have learned other keys)."""
    log = work / "gateway" / "completions"
    origin = json.loads((log / "log.json").read_text())["origin_epoch_s"]
    done = pd.concat([pd.read_parquet(f) for f in sorted(log.glob("part-*.parquet"))])
    sent = pd.read_parquet(
        work / "bench" / "requests.parquet", columns=["request_id", "trace_index"]
    )
    done = done.merge(sent, on="request_id", how="left")
    done["arrival_t"] = origin + done["arrival_s"]
    done["finish_t"] = origin + done["finish_s"]
    expected = with_live_keys(live.iloc[done["trace_index"].to_numpy(dtype=np.int64)])
    same = float(np.mean(expected["prompt_key"].to_numpy() == done["prompt_key"].to_numpy()))
    if same < 0.99:
        raise RuntimeError(f"the gateway's prompt keys match the history's for {same:.0%} only")
    return done, float(done.loc[done["trace_index"] >= change_row, "arrival_t"].min())


def drifts(timeline: list[dict], version: str, block: int) -> tuple[float | None, float | None]:
    """A version's last drift reading, and its last with a full window (None: never)."""
    seen = [r["versions"][version] for r in timeline if version in r["versions"]]
    full = [v["drift"] for v in seen if v.get("window", 0) >= block]
    return (seen[-1].get("drift") if seen else None), (full[-1] if full else None)


def verdict(
    plan: Plan, timeline: list[dict], done: pd.DataFrame, change_t: float, work: Path
) -> dict:
    """Issue 33's three live targets, from the timeline and the logs."""
    finish_t = np.sort(done["finish_t"].to_numpy())

    def finished_since(t: float) -> int:
        return int(np.searchsorted(finish_t, t) - np.searchsorted(finish_t, change_t))

    admitted = done.sort_values("arrival_t").dropna(subset=["model_version"])
    first = admitted.groupby("model_version", sort=False)["arrival_t"].min()
    at_change = str(admitted.loc[admitted["arrival_t"] >= change_t, "model_version"].iloc[0])
    before = [r for r in timeline if r["t"] <= change_t and at_change in r["versions"]]
    detect = next((r for r in timeline if r["t"] > change_t
                   and r["versions"].get(at_change, {}).get("drift", 0) > DRIFT_LIMIT), None)  # fmt: skip
    versions = {}
    for version, t in first.items():
        last, settled = drifts(timeline, str(version), plan.block)
        versions[str(version)] = {"first_admission_after_change_s": round(t - change_t, 1),
                                  "final_drift": last, "final_full_window_drift": settled}  # fmt: skip
    retrained = [v for v, t in first.items() if t > change_t and versions[str(v)]["final_full_window_drift"] is not None]  # fmt: skip
    recovered = versions[str(retrained[-1])]["final_full_window_drift"] if retrained else None
    bench = json.loads((work / "bench" / "summary.json").read_text())
    detected_blocks = None if detect is None else finished_since(detect["t"]) / plan.block
    twin = [r["twin_weight"] for r in timeline]
    return {
        "serving_at_change": at_change,
        "its_drift_before_change": before[-1]["versions"][at_change].get("drift")
        if before
        else None,
        "drift_detected_after_blocks": detected_blocks,
        "versions": versions,
        "recovered_version": str(retrained[-1]) if retrained else None,
        "twin_weight_values": sorted({w for row in twin for w in row.values()}),
        "requests": len(done),
        "bench": {k: bench.get(k) for k in ("num_prompts", "completed", "failed")},
        "targets": {
            "drift_within_2_blocks": detected_blocks is not None and detected_blocks <= 2,
            "recovered_within_10pct": recovered is not None and recovered <= RECOVERED,
            "none_lost": bench.get("failed") == 0
            and bench.get("completed") == bench.get("num_prompts") == len(done),
        },
    }


def plot(timeline: list[dict], change_t: float, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t0 = timeline[0]["t"]
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(9, 6))
    for version in sorted({v for r in timeline for v in r["versions"]}):
        pts = [((r["t"] - t0) / 60, r["versions"][version].get("drift", np.nan)) for r in timeline
               if version in r["versions"]]  # fmt: skip
        top.plot(*zip(*pts, strict=True), label=f"version {version}")
    top.axhline(DRIFT_LIMIT, color="grey", ls=":")
    top.set_ylabel("drift (live / holdout Brier)")
    top.legend()
    for arm in sorted({a for r in timeline for a in r["twin_weight"]}):
        pts = [((r["t"] - t0) / 60, r["twin_weight"].get(arm, np.nan)) for r in timeline]
        bottom.plot(*zip(*pts, strict=True), label=f"twin weight {arm}")
    bottom.set_ylabel("twin weight")
    bottom.set_xlabel("minutes")
    for ax in (top, bottom):
        ax.axvline((change_t - t0) / 60, color="red", ls="--")
    fig.tight_layout()
    fig.savefig(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--history", type=int, default=4, help="blocks fitting the first champion")
    ap.add_argument("--before", type=int, default=4, help="live blocks before the change")
    ap.add_argument("--after", type=int, default=8, help="live blocks after the change")
    ap.add_argument("--window", type=int, default=4, help="blocks a pipeline cycle reads")
    ap.add_argument("--load", type=float, default=0.95)
    ap.add_argument("--period", type=float, default=60.0, help="seconds between pipeline cycles")
    ap.add_argument("--poll", type=float, default=5.0)
    ap.add_argument("--port", type=int, default=18400)
    ap.add_argument(
        "--time-scale", type=float, default=1.0, help="faster than real time (a quick look)"
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    plan = Plan(
        a.ranks,
        a.slots,
        a.history,
        a.before,
        a.after,
        a.load,
        a.period,
        a.poll,
        a.port,
        a.time_scale,
        a.window,
    )
    work = a.out.resolve()
    work.mkdir(parents=True, exist_ok=True)
    history, live, change_row = workload(plan)
    load_before = os.getloadavg()
    timeline = run(plan, work, history, live)
    done, change_t = outcomes(work, live, change_row)
    result = {"plan": dataclasses.asdict(plan), "block": plan.block, "change_epoch_s": change_t,
              **verdict(plan, timeline, done, change_t, work), "load_before": load_before,
              "load_after": os.getloadavg(), "timeline": timeline}  # fmt: skip
    plot(timeline, change_t, work / "timeline.png")
    (work / "result.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

"""The gateway live against the simulator: one run, every arm side by side, printed as JSON.

For each shared trace (Azure conversations, Mooncake conversations): the earlier ``--train``
requests fit the learned estimators (their prompt keys mapped to the keys the gateway derives
from the live prompts, ``features/prompts.py``), the simulator picks the best of them for BR-H on
the replay slice, and then the next ``--requests`` requests are replayed live by
``balanceroute bench`` at ``--load`` times the decode capacity against a real
``balanceroute emulate`` group (G = 8, B = 32, ``paper-dsv3``, the trace's time scale): through
``balanceroute gateway`` with each router, and round-robin straight to the ranks. Every live run
is compared with the simulator replaying the same requests, released at the same (scaled) arrival
times, on the same group and cost model.

Live steady state ("requests waiting somewhere"): an emulator iteration is steady when, as it
starts, a request waits in the gateway's pool (the gateway's last tick sample before it,
``OUT/ticks.parquet``, both clocks are this machine's wall clock) or in a rank's own queue (the
round-robin baseline queues there); the simulator's steady iterations are those whose pool is
non-empty after admission (its own definition). Imbalance ``I(k) = G max_g L_g - sum_g L_g``
over them, from the emulator's logged loads. Throughput is output tokens per second of busy
model time (the sum of the iterations' cost-model durations, idle spells left out, for both); TPOT p95 in model milliseconds; queueing p99 is the wait in the gateway's pool plus the
wait at the rank (arrival to admission), in model seconds.

Also: the added TTFT at low load (the same requests straight to the ranks and through the
gateway), and a switchback on each trace (``brh:none`` against the best learned estimator, at
least ``--windows`` windows) beside the offline ``balanceroute ab`` of the same arms.

    .venv/bin/python benchmarks/perf/live_gateway.py --out runs/live_gateway > runs/live_gateway.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd

from balanceroute.features.columns import canonical_columns
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.prompts import PROMPT_KEY_TOKENS, build_prompt, prompt_key_of
from balanceroute.features.schema import hash_keys, to_arrays
from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import load_file, save_estimator
from balanceroute.router.lab.cost import cost_preset
from balanceroute.router.lab.prefill import ReleasedRequests, rate_scale_for_load
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import RequestTable
from balanceroute.serving.testbed.emulator.iterlog import loads_at, rank_matrix, read_log
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port, free_ports

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
TRACES = {"azure": "azure_llm_2023_conv.csv", "mooncake": "mooncake_conversation.jsonl"}
ROUTERS = ("count-jsq", "token-jsq", "br0", "brh:none")
LEARNED = ("survival", "exactmatch", "gbdt")
G, B, COST = 8, 32, "paper-dsv3"
SWITCHBACK_KEYS = ("windows_done", "per_arm", "paired_vs_reference", "bench_completed",
                   "bench_failed")  # fmt: skip
CLI = [sys.executable, "-c", "import sys; from balanceroute.cli import main; sys.exit(main())"]


def stop(server: ServerProcess, timeout_s: float = 60.0) -> None:
    server.terminate(timeout_s)


def live_key(key: object, n: int) -> str:
    """The key the gateway derives from the prompt bench builds for a trace row."""
    return prompt_key_of(
        build_prompt(min(n, PROMPT_KEY_TOKENS), None if pd.isna(key) else str(key))
    )


def with_live_keys(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.copy()
    out["prompt_key"] = [
        live_key(k, n) for k, n in zip(frame["prompt_key"], frame["prompt_tokens"], strict=True)
    ]
    return out


def rebased(frame: pd.DataFrame) -> pd.DataFrame:
    out = frame.reset_index(drop=True).copy()
    out["arrival_s"] = out["arrival_s"] - out["arrival_s"].iloc[0]
    return out


# ---- the simulator ------------------------------------------------------------------------------
def released(frame: pd.DataFrame, load: float) -> tuple[ReleasedRequests, float]:
    """Releases at the arrival times bench sends at (model time): no prefill tier live."""
    arrays = to_arrays(frame)
    scale = rate_scale_for_load(arrays, load, G, B, cost_preset(COST))
    live = hash_keys(with_live_keys(frame)["prompt_key"])
    n = len(frame)
    rel = ReleasedRequests(
        release_s=(arrays.arrival_s - arrays.arrival_s[0]) / scale,
        prompt_tokens=arrays.prompt_tokens,
        output_tokens=arrays.output_tokens,
        table=RequestTable(arrays.prompt_tokens, live, np.arange(n, dtype=np.int64)),
    )
    return rel, scale


def steady_imbalance(loads: np.ndarray, busy: np.ndarray) -> tuple[float | None, int]:
    imb = loads.shape[1] * loads.max(axis=1) - loads.sum(axis=1)
    return (float(imb[busy].mean()) if busy.any() else None), int(busy.sum())


def sim_arm(rel: ReleasedRequests, spec: str, model_file: str | None) -> dict[str, Any]:
    rs = RouterSpec.parse(spec)
    est = None
    if rs.estimator is not None:
        est = load_file(model_file) if model_file else build_estimator(rs.estimator)
    result = simulate(rel, rs.build_policy(est), SimConfig(G, B, cost_preset(COST)))
    imb, n_steady = steady_imbalance(result.loads, result.waiting > 0)
    cost = cost_preset(COST)
    busy = float((cost.t_fixed_s + cost.t_comm_s + cost.t_token_s * result.max_load).sum())
    tpot = (result.finish_s - result.admit_s) / result.output_tokens
    queue = result.admit_s - result.release_s
    return {
        "steady_imbalance": imb,
        "steady_iterations": n_steady,
        "throughput_tok_s": float(result.output_tokens.sum()) / busy,
        "tpot_p95_ms": float(np.percentile(tpot, 95) * 1e3),
        "queue_p99_s": float(np.percentile(queue, 99)),
        "router_step_p50_us": float(np.median(result.router_ns)) / 1e3
        if result.router_ns.size
        else None,
    }


# ---- live runs ---------------------------------------------------------------------------------
def start_emulator(ts: float, log_dir: Path, out: Path) -> tuple[ServerProcess, list[str]]:
    base = free_ports(G)
    cfg = {"ranks": G, "slots": B, "time_scale": ts, "port_base": base, "log_dir": str(log_dir)}
    args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator", json.dumps(cfg)]
    proc = ServerProcess(args, log=out)
    urls = [f"http://127.0.0.1:{base + g}" for g in range(G)]
    proc.wait_ready([u + "/health" for u in urls], timeout_s=180, poll_s=0.2)
    return proc, urls


def start_gateway(urls: list[str], extra: list[str], out_dir: Path) -> tuple[ServerProcess, str]:
    port = free_port()
    args = [*CLI, "gateway", "--slots", str(B), "--port", str(port), "--out", str(out_dir)]
    for u in urls:
        args += ["--rank", u]
    env = clean_env({"BALANCEROUTE_LOG_LEVEL": "warning"})
    proc = ServerProcess(args + extra, log=out_dir.parent / "gateway.out", env=env)
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready([url + "/readyz"], timeout_s=180, poll_s=0.2)
    return proc, url


def bench(urls: list[str], trace: Path, n: int, load: float, ts: float, out: Path) -> dict:
    args = [*CLI, "bench", "--trace", str(trace), "--requests", str(n), "--load", str(load),
            "--time-scale", str(ts), "--slots", str(B), "--ranks", str(G), "--out", str(out),
            "--no-progress", "--request-timeout", "900"]  # fmt: skip
    for u in urls:
        args += ["--url", u]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


def live_arm(name: str, router: str | None, trace: Path, n: int, ts: float, out: Path,
             load: float) -> dict[str, Any]:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(ts, out / "emulator", out / "emulator.out")
    gw = None
    step = None
    try:
        if router is not None:
            gw, gw_url = start_gateway(urls, ["--router", router, "--no-mlflow"], out / "gateway")
            summary = bench([gw_url], trace, n, load, ts, out / "bench")
            ab = httpx.get(gw_url + "/v1/ab", timeout=10).json()
            step = ab["per_arm"][router]["router_step_p50_us"]
        else:
            summary = bench(urls, trace, n, load, ts, out / "bench")
    finally:
        if gw is not None:
            stop(gw)
        stop(emu)
    (out / "live.json").write_text(json.dumps({"summary": summary, "router_step_p50_us": step}))
    return live_figures(out, summary, ts, step, n)


def steady_mask(out: Path, iterations: pd.DataFrame) -> np.ndarray:
    """The live steady iterations (module docstring): a request waits at a rank or, as the
    iteration starts, in the gateway's pool (its last tick sample before)."""
    waiting = rank_matrix(iterations, "waiting").sum(axis=1) > 0
    ticks_file = out / "gateway" / "ticks.parquet"
    if ticks_file.exists():
        epoch = json.loads((out / "emulator" / "config.json").read_text())["epoch"]
        ticks = pd.read_parquet(ticks_file, columns=["time_s", "pool"])
        at = np.searchsorted(ticks["time_s"].to_numpy(), epoch + iterations["start_s"].to_numpy())
        pool = np.where(at > 0, ticks["pool"].to_numpy()[np.maximum(at - 1, 0)], 0)
        waiting |= pool > 0
    return waiting


def steady_series(out: Path, saturated: float = 0.0) -> np.ndarray:
    """The imbalance ``G max - sum`` of every live steady iteration, in order (for intervals);
    with ``saturated``, only those with at least that share of the slots running (a request
    held by ``--hold`` waits in the pool while slots are free: the simulator's steady
    iterations are all full)."""
    iterations, _ = read_log(out / "emulator")
    loads = rank_matrix(iterations, "loads").astype(np.float64)
    imb = loads.shape[1] * loads.max(axis=1) - loads.sum(axis=1)
    mask = steady_mask(out, iterations)
    if saturated > 0:
        running = rank_matrix(iterations, "running").sum(axis=1)
        mask &= running >= saturated * G * B
    return imb[mask]


def live_figures(out: Path, summary: dict, ts: float, step: float | None, n: int) -> dict:
    iterations, requests = read_log(out / "emulator")
    loads = rank_matrix(iterations, "loads").astype(np.float64)
    waiting = steady_mask(out, iterations)
    ticks_file = out / "gateway" / "ticks.parquet"
    imb, n_steady = steady_imbalance(loads, waiting)
    view = gateway_view(out, iterations, requests) if ticks_file.exists() else {}
    running = rank_matrix(iterations, "running").sum(axis=1)
    idle = G * B - running[waiting]  # slots the engine had free while requests waited
    busy = float(iterations["duration_s"].sum())  # model seconds with work (no idle)
    done = requests[requests["finish_reason"] != "abort"]
    rank_wait = (done["admit_s"] - done["recv_s"]).to_numpy()
    queue = pd.Series(rank_wait, index=done["request_id"].to_numpy())
    comp = out / "gateway" / "completions"
    if comp.exists():
        gw = canonical_columns(
            pd.concat([pd.read_parquet(p) for p in sorted(comp.glob("part-*.parquet"))])
        )
        queue = queue.add(gw.set_index("request_id")["queue_delay_s"], fill_value=0.0)
    return {
        "completed": summary["completed"],
        "failed": summary["failed"],
        "requests": n,
        "steady_imbalance": imb,
        "steady_iterations": n_steady,
        "iterations": len(iterations),
        "throughput_tok_s": float(done["generated"].sum()) / busy,
        "tpot_p95_ms": summary["p95_tpot_ms"] * ts,
        "queue_p99_s": float(np.percentile(queue.to_numpy(), 99)) * ts,
        "router_step_p50_us": step,
        "emulator_resyncs": json.loads((out / "emulator" / "summary.json").read_text())["resyncs"],
        "median_ttft_ms_wall": summary["median_ttft_ms"],
        "idle_slots_while_waiting_p50": float(np.median(idle)) if idle.size else None,
        "iteration_wall_ms_p50": float(np.median(np.diff(iterations["end_s"].to_numpy())) * 1e3),
        **view,
    }


def gateway_view(out: Path, iterations: pd.DataFrame, requests: pd.DataFrame) -> dict[str, Any]:
    """How closely and how promptly the gateway followed the engine, from its tick samples and
    logs beside the emulator's: the relative L1 error of its per-rank loads against the engine's
    at each tick with requests running (median, p90; ``--tick`` samples, ticks of older runs
    without the per-rank view give none); the gap between ticks while requests wait (p50, p90:
    a late tick is a busy event loop); the time from an admission (the client's request leaving
    the pool) to the rank receiving it, and from the rank's last token to the gateway logging
    the finish (p50, p90, ms)."""
    epoch = json.loads((out / "emulator" / "config.json").read_text())["epoch"]
    ticks = pd.read_parquet(out / "gateway" / "ticks.parquet")
    t = ticks["time_s"].to_numpy() - epoch
    gaps = np.diff(t)[ticks["pool"].to_numpy()[1:] > 0] * 1e3
    row: dict[str, Any] = {
        "tick_gap_waiting_ms_p50": float(np.median(gaps)) if gaps.size else None,
        "tick_gap_waiting_ms_p90": float(np.percentile(gaps, 90)) if gaps.size else None,
    }
    if "loads" in ticks.columns:
        seen = np.stack(ticks["loads"].to_numpy()).astype(np.float64)
        truth = loads_at(iterations, requests, t, G)
        busy = truth.sum(axis=1) > 0
        err = np.abs(seen - truth).sum(axis=1)[busy] / truth.sum(axis=1)[busy]
        row["view_error_p50"] = float(np.median(err)) if err.size else None
        row["view_error_p90"] = float(np.percentile(err, 90)) if err.size else None
    comp = out / "gateway" / "completions"
    if comp.exists():
        origin = json.loads((comp / "log.json").read_text())["origin_epoch_s"]
        gw = pd.concat([pd.read_parquet(p) for p in sorted(comp.glob("part-*.parquet"))])
        gw = canonical_columns(gw).set_index("request_id")
        rq = requests.drop_duplicates("request_id", keep=False).set_index("request_id")
        mine = gw[["arrival_s", "queue_delay_s", "finish_s"]].add_suffix("_gateway")
        both = rq.join(mine, how="inner")
        sent = origin + both["arrival_s_gateway"] + both["queue_delay_s_gateway"] - epoch
        forward = (both["recv_s"] - sent).to_numpy() * 1e3
        heard = (origin + both["finish_s_gateway"] - epoch - both["finish_s"]).to_numpy() * 1e3
        for name, v in (("forward_lag_ms", forward), ("finish_heard_lag_ms", heard)):
            row[f"{name}_p50"] = float(np.median(v)) if v.size else None
            row[f"{name}_p90"] = float(np.percentile(v, 90)) if v.size else None
    return row


def _outside_the_engine_ms(bench_dir: Path, emulator_dir: Path) -> np.ndarray:
    """Per request: TTFT seen by the client minus the engine's own (arrival at the rank to its
    first chunk written), in ms: what lies outside the engine (client, network, gateway)."""
    client = pd.read_parquet(bench_dir / "requests.parquet").set_index("request_id")["ttft_s"]
    _, rq = read_log(emulator_dir)
    rq = rq.drop_duplicates("request_id", keep=False).set_index("request_id")
    engine = rq["first_sent_s"] - rq["recv_s"]
    both = pd.concat([client, engine], axis=1, join="inner").dropna()
    return ((both.iloc[:, 0] - both.iloc[:, 1]) * 1e3).to_numpy()


def added_ttft(trace: Path, ts: float, out: Path, n: int, load: float) -> dict[str, Any]:
    """TTFT added by the gateway at low load: the same requests straight to the ranks and
    through the gateway, each against the engine's own first-chunk time (so the wait for the
    engine's next iteration, the same either way, is not counted)."""
    out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(ts, out / "emulator-direct", out / "emulator-direct.out")
    try:
        direct = bench(urls, trace, n, load, ts, out / "direct")
    finally:
        stop(emu)
    emu, urls = start_emulator(ts, out / "emulator-via", out / "emulator-via.out")
    try:
        gw, gw_url = start_gateway(urls, ["--router", "count-jsq", "--no-mlflow"], out / "gateway")
        try:
            via = bench([gw_url], trace, n, load, ts, out / "via")
        finally:
            stop(gw)
    finally:
        stop(emu)
    d = _outside_the_engine_ms(out / "direct", out / "emulator-direct")
    v = _outside_the_engine_ms(out / "via", out / "emulator-via")
    return {
        "requests": n,
        "load": load,
        "time_scale": ts,
        "direct_median_ttft_ms": direct["median_ttft_ms"],
        "gateway_median_ttft_ms": via["median_ttft_ms"],
        "direct_outside_engine_ms_p50": float(np.median(d)),
        "gateway_outside_engine_ms_p50": float(np.median(v)),
        "gateway_outside_engine_ms_p90": float(np.percentile(v, 90)),
        "added_median_ttft_ms": float(np.median(v) - np.median(d)),
    }


def switchback(urls_trace: Path, arms: str, n: int, ts: float, window_s: float, out: Path,
               load: float) -> dict:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(ts, out / "emulator", out / "emulator.out")
    try:
        extra = ["--arms", arms, "--switch-every", f"{window_s}s", "--warmup", f"{window_s / 4}s",
                 "--no-mlflow"]  # fmt: skip
        gw, gw_url = start_gateway(urls, extra, out / "gateway")
        try:
            summary = bench([gw_url], urls_trace, n, load, ts, out / "bench")
            ab = httpx.get(gw_url + "/v1/ab", timeout=30).json()
        finally:
            stop(gw)
    finally:
        stop(emu)
    return {"bench_completed": summary["completed"], "bench_failed": summary["failed"], **ab}


def offline_ab(trace: Path, arms: str, n: int, load: float, out: Path) -> dict:
    args = [*CLI, "ab", "--trace", str(trace), "--requests", str(n), "--arms", arms,
            "--workers", str(G), "--slots", str(B), "--load", str(load), "--repeats", "5",
            "--no-mlflow", "--out", str(out)]  # fmt: skip
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "summary.json").read_text())


# ---- one trace ----------------------------------------------------------------------------------
def fit_models(train: pd.DataFrame, out: Path) -> dict[str, str]:
    out.mkdir(parents=True, exist_ok=True)
    files = {}
    for kind in LEARNED:
        est = build_estimator(
            EstimatorSpec(kind), history=with_live_keys(train), horizon=DEFAULT_HORIZON
        )
        files[kind] = str(save_estimator(est, out / f"{kind}.joblib"))
    return files


def one_trace(name: str, args: argparse.Namespace, out: Path) -> dict[str, Any]:
    ts = args.time_scale[name]
    frame, _ = load_workload(WorkloadSpec(trace=str(DATA / TRACES[name])))
    train = frame.iloc[: args.train]
    replay = rebased(frame.iloc[args.train : args.train + args.requests])
    rest = rebased(frame.iloc[args.train :])
    out.mkdir(parents=True, exist_ok=True)
    replay_file = write_trace(replay, out / "replay.parquet")
    rest_file = write_trace(rest, out / "switchback.parquet")
    rest_keys = write_trace(with_live_keys(rest), out / "switchback-live-keys.parquet")
    models = fit_models(train, out / "models")
    rel, _ = released(replay, args.load)
    routers = tuple(args.routers)
    sim = {r: sim_arm(rel, r, None) for r in routers}
    learned = {k: sim_arm(rel, f"brh:{k}", f) for k, f in models.items()}
    best = min(learned, key=lambda k: learned[k]["steady_imbalance"] or np.inf)
    best_spec = f"brh:{best}@{models[best]}"
    sim["brh:best"] = learned[best]
    live = {}
    for r in (*routers, "brh:best", "direct"):
        spec = best_spec if r == "brh:best" else (None if r == "direct" else r)
        live[r] = live_arm(name, spec, replay_file, args.requests, ts, out / r.replace(":", "-"),
                           args.load)  # fmt: skip
        print(f"{name} {r}: {json.dumps(live[r])}", file=sys.stderr, flush=True)
    table = build_table(live, sim, routers)
    sb_arms = f"brh:none,{best_spec}"
    window = args.switch_window[name]
    sb_n = len(rest) if args.switch_requests is None else min(len(rest), args.switch_requests)
    sb = ab = None
    if not args.no_switchback:
        sb = switchback(rest_file, sb_arms, sb_n, ts, window, out / "switchback", args.load)
        ab = offline_ab(rest_keys, sb_arms, sb_n, args.load, out / "offline-ab")
    return {
        "trace": TRACES[name],
        "time_scale": ts,
        "requests": args.requests,
        "train_requests": args.train,
        "best_estimator": best,
        "sim_learned": learned,
        "live": live,
        "sim": sim,
        "table": table,
        "switchback": None if sb is None else {k: sb[k] for k in SWITCHBACK_KEYS},
        "offline_ab": None if ab is None else {a: ab["arms"][a] for a in ab["arms"]},
    }


def build_table(live: dict, sim: dict, routers: tuple[str, ...]) -> dict[str, dict]:
    """Every router against ``count-jsq``, live and simulated side by side."""
    ref_live, ref_sim = live["count-jsq"], sim["count-jsq"]
    table = {}
    for r in (*routers, "brh:best"):
        li, si = live[r], sim[r]
        table[r] = {
            "live_imbalance_ratio": _ratio(li["steady_imbalance"], ref_live["steady_imbalance"]),
            "sim_imbalance_ratio": _ratio(si["steady_imbalance"], ref_sim["steady_imbalance"]),
            "live_throughput_gain": _ratio(li["throughput_tok_s"], ref_live["throughput_tok_s"]),
            "sim_throughput_gain": _ratio(si["throughput_tok_s"], ref_sim["throughput_tok_s"]),
            "live_tpot_p95_ratio": _ratio(li["tpot_p95_ms"], ref_live["tpot_p95_ms"]),
            "live_queue_p99_ratio": _ratio(li["queue_p99_s"], ref_live["queue_p99_s"]),
            "router_step_p50_us": li["router_step_p50_us"],
        }
    return table


def reanalyze(old: dict[str, Any], args: argparse.Namespace, out: Path) -> dict[str, Any]:
    """A saved run's figures recomputed from its logs (live) and fresh replays (simulator);
    the switchback, the offline A/B and the TTFT are kept as they were."""
    for name, t in old["traces"].items():
        folder = out / name
        replay = pd.read_parquet(folder / "replay.parquet")
        rel, _ = released(replay, old["load"])
        routers = tuple(r for r in t["table"] if r != "brh:best")
        sim = {r: sim_arm(rel, r, None) for r in routers}
        best = t["best_estimator"]
        sim["brh:best"] = sim_arm(rel, f"brh:{best}", str(folder / "models" / f"{best}.joblib"))
        live = {}
        for r in (*routers, "brh:best", "direct"):
            arm_dir = folder / r.replace(":", "-")
            summary = json.loads((arm_dir / "bench" / "summary.json").read_text())
            step = t["live"][r]["router_step_p50_us"]
            live[r] = live_figures(arm_dir, summary, t["time_scale"], step, t["requests"])
        t.update(live=live, sim=sim, table=build_table(live, sim, routers))
    old["reanalyzed"] = True
    return old


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def render(result: dict[str, Any]) -> str:
    """The live-versus-simulated tables of ``docs/results.md`` from a saved JSON result."""
    lines = []
    for name, t in result["traces"].items():
        lines += [
            f"**{name}** ({t['requests']:,} requests after {t['train_requests']:,} for training, "
            f"time scale {t['time_scale']:g}, best learned estimator `{t['best_estimator']}`):",
            "",
            "| router | imbalance ratio live / sim | throughput gain live / sim | TPOT p95 ratio "
            "live | queueing p99 ratio live | router step p50 (us) |",
            "|---|---|---|---|---|---|",
        ]
        for arm, row in t["table"].items():
            lines.append(
                f"| `{arm}` | {_f(row['live_imbalance_ratio'])} / "
                f"{_f(row['sim_imbalance_ratio'])} | {_f(row['live_throughput_gain'])} / "
                f"{_f(row['sim_throughput_gain'])} | {_f(row['live_tpot_p95_ratio'])} | "
                f"{_f(row['live_queue_p99_ratio'])} | {_f(row['router_step_p50_us'], '.0f')} |"
            )
        direct = t["live"]["direct"]
        lines += [
            f"| round-robin, no gateway | steady imbalance {_f(direct['steady_imbalance'], ',.0f')}"
            f" (count-jsq {_f(t['live']['count-jsq']['steady_imbalance'], ',.0f')}) | "
            f"{_f(direct['throughput_tok_s'] / t['live']['count-jsq']['throughput_tok_s'])} | "
            f"{_f(direct['tpot_p95_ms'] / t['live']['count-jsq']['tpot_p95_ms'])} | "
            f"{_f(direct['queue_p99_s'] / t['live']['count-jsq']['queue_p99_s'])} | |",
            "",
        ]
        sb = t["switchback"]
        if sb is None:
            continue
        ref, other = list(sb["per_arm"])
        d = sb["paired_vs_reference"][other]["imbalance"]
        off = t["offline_ab"]
        off_diff = off[other]["steady_mean_imbalance"] - off[ref]["steady_mean_imbalance"]
        lines += [
            f"Switchback ({sb['windows_done']} windows): imbalance of the learned arm minus "
            f"`brh:none` {_f(d['mean'], ',.0f')} tokens, 95% interval [{_f(d['low'], ',.0f')}, "
            f"{_f(d['high'], ',.0f')}] over {d['pairs']} pairs; offline `ab` on the same "
            f"requests: {_f(off_diff, ',.0f')} (steady mean imbalance).",
            "",
        ]
    tt = result.get("added_ttft")
    if tt is None:
        return "\n".join(lines)
    lines.append(
        f"Added TTFT at low load ({tt['requests']} requests at {tt.get('load', 0.1):g}x capacity, "
        f"time scale {tt.get('time_scale', result.get('ttft_time_scale', 'n/a'))}): client TTFT "
        f"minus the engine's own first-chunk time, median "
        f"{_f(tt.get('direct_outside_engine_ms_p50'), '.2f')} ms straight to the ranks and "
        f"{_f(tt.get('gateway_outside_engine_ms_p50'), '.2f')} ms through the gateway: "
        f"+{_f(tt['added_median_ttft_ms'], '.2f')} ms (raw medians "
        f"{_f(tt['direct_median_ttft_ms'], '.1f')} and {_f(tt['gateway_median_ttft_ms'], '.1f')} ms)."
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved result, then stop")
    p.add_argument(
        "--reanalyze", metavar="JSON", help="recompute a saved run's figures from --out's logs"
    )
    p.add_argument("--out", default="runs/live_gateway")
    p.add_argument("--traces", default="azure,mooncake")
    p.add_argument("--requests", type=int, default=2000)
    p.add_argument("--train", type=int, default=3000)
    p.add_argument("--load", type=float, default=1.1)
    p.add_argument("--azure-time-scale", type=float, default=4.0)
    p.add_argument("--mooncake-time-scale", type=float, default=16.0)
    p.add_argument("--azure-window", type=float, default=11.0, help="switchback window, wall s")
    p.add_argument("--mooncake-window", type=float, default=9.0)
    p.add_argument("--switch-requests", type=int, help="requests of the switchback (default all)")
    p.add_argument("--routers", type=lambda t: t.split(","), default=list(ROUTERS))
    p.add_argument("--no-switchback", action="store_true")
    p.add_argument("--no-ttft", action="store_true")
    p.add_argument("--ttft-requests", type=int, default=300)
    p.add_argument("--ttft-load", type=float, default=0.2)
    p.add_argument("--ttft-only", action="store_true", help="only the added-TTFT measurement")
    p.add_argument(
        "--ttft-time-scale",
        type=float,
        default=1.0,
        help="low-load TTFT run: short iterations, so the wait for the next one is small noise",
    )
    args = p.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    if args.reanalyze:
        old = json.loads(Path(args.reanalyze).read_text())
        print(json.dumps(reanalyze(old, args, Path(args.out)), indent=2, default=float))
        return
    args.time_scale = {"azure": args.azure_time_scale, "mooncake": args.mooncake_time_scale}
    args.switch_window = {"azure": args.azure_window, "mooncake": args.mooncake_window}
    out = Path(args.out)
    load_before = os.getloadavg()
    t0 = time.time()
    result: dict[str, Any] = {"G": G, "B": B, "cost": COST, "load": args.load, "traces": {}}
    names = [t.strip() for t in args.traces.split(",") if t.strip()]
    for name in [] if args.ttft_only else names:
        result["traces"][name] = one_trace(name, args, out / name)
    if args.ttft_only:
        folder = out / names[0]
        folder.mkdir(parents=True, exist_ok=True)
        frame, _ = load_workload(WorkloadSpec(trace=str(DATA / TRACES[names[0]])))
        replay = rebased(frame.iloc[args.train : args.train + args.ttft_requests])
        write_trace(replay, folder / "replay.parquet")
    first = names[0]
    result["added_ttft"] = (
        None
        if args.no_ttft
        else added_ttft(
            out / first / "replay.parquet",
            args.ttft_time_scale,
            out / "ttft",
            args.ttft_requests,
            args.ttft_load,
        )
    )
    result["ttft_time_scale"] = args.ttft_time_scale
    result["wall_s"] = time.time() - t0
    result["loadavg_before"] = load_before
    result["loadavg_after"] = os.getloadavg()
    print(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()

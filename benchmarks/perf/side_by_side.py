"""The gateway and the peer routers side by side on one emulated group, in one run, as JSON.

Arms, each on a fresh ``balanceroute emulate`` group (G = 8, B = 32, ``paper-dsv3``, real time
unless ``--time-scale``) with ``balanceroute bench`` as the client, the same requests for all:
``direct`` (bench round-robin straight to the ranks), the gateway with ``count-jsq``, ``br0`` and
``brh``, and every policy of ``sglang-router`` and ``vllm-router`` (from the cached virtual
environment ``scripts/install_peers.sh`` makes; ``--peers-bin`` points elsewhere). The emulator
answers what the peers ask an engine for (``/get_load``, ``/get_server_info``,
``/get_model_info``, ``/v1/completions/render``; the ``vllm-router`` arms get ``/get_load`` in
the shape it reads), so their load-aware policies run with the information a real engine gives.

Per arm and load (``--loads``, fractions of the group's decode capacity): the added median
time to first token over ``direct`` (per request, the client's TTFT minus the engine's own
arrival-to-first-chunk time, so the wait for the engine's next iteration is not counted),
output tokens per wall second and per busy model second, the live steady imbalance from the
emulator's iteration log (iterations with a request waiting in a rank's queue or the gateway's
pool), the router process's CPU seconds per 1,000 relayed output tokens (CPU from ready to the
end of the bench run), and the machine's load average before and after.

    .venv/bin/python benchmarks/perf/side_by_side.py --out runs/side_by_side > runs/side_by_side.json
    .venv/bin/python benchmarks/perf/side_by_side.py --render runs/side_by_side.json

The gateway's layout is ``--gateway-modes`` (default ``inproc``, the gateway's own default: the
Protocol front beside the decider in one process, started with ``--no-mlflow --out DIR`` and the
warning log level); ``plain`` is the same layout started as a user would, with only the required
flags, and ``now`` that with ``--decide now``; ``proto1`` and ``proto2`` run relay worker processes (``--relay-workers N``). Every arm is named ``gateway[MODE]:ROUTER``.
``--pin`` runs each router alone on the last CPU and the emulator and the client on the others
(by default all share every CPU).
``--floor`` adds the arm ``floor``, ``bare_relay.py``: what a Python relay on uvloop and httptools
pays here with no checks, count or decision (the gap between it and the gateway is the gateway's
own work). The layouts in
one short run::

    .venv/bin/python benchmarks/perf/side_by_side.py --out runs/plane \
        --gateway-modes proto1,proto2,inproc --routers count-jsq,brh \
        --sglang-policies round_robin --vllm-policies round_robin,power_of_two > runs/plane.json
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
import psutil

from balanceroute.features.trace_io import write_trace
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.serving.testbed.emulator.config import DEFAULT_MODEL
from balanceroute.serving.testbed.emulator.iterlog import rank_matrix, read_log
from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port, free_ports

REPO = Path(__file__).resolve().parents[2]
DATA = REPO.parent / "shared" / "data"
TRACE = "azure_llm_2023_conv.csv"
G, B = 8, 32
GATEWAY_ROUTERS = ("count-jsq", "br0", "brh")
SGLANG_POLICIES = ("round_robin", "random", "power_of_two", "cache_aware")
VLLM_POLICIES = ("round_robin", "random", "power_of_two", "cache_aware", "kv_aware",
                 "consistent_hash", "sticky_least_loaded")  # fmt: skip
CLI = [sys.executable, "-c", "import sys; from balanceroute.cli import main; sys.exit(main())"]


PIN: list[int] = []  # the router's CPU under --pin


def pin_router() -> None:
    """``--pin``: the last CPU set aside for the router (:func:`start_router`), this process on
    the others (the emulator and the client it starts inherit them)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--pin needs at least two CPUs")
    PIN[:] = [cpus[-1]]
    os.sched_setaffinity(0, cpus[:-1])


GATEWAY_MODES = {  # the gateway's process layout, by --gateway-modes name
    "proto1": ["--relay-workers", "1"],
    "proto2": ["--relay-workers", "2"],
    "inproc": [],  # the Protocol front beside the decider, one process (the default)
    "plain": [],  # inproc started as a user would: only the required flags (MLflow on, info log)
    "now": ["--decide", "now"],  # plain, each decision at once instead of the step-timed default
}


def arms(args: argparse.Namespace) -> list[tuple[str, str, str | None]]:
    """(name, kind, policy) of every arm, ``direct`` first (a gateway arm's kind names its
    mode: ``gateway-MODE``; with ``--base-python`` every gateway arm
    again as ``base[MODE]:ROUTER``, kind ``base-gateway...``, run by that interpreter)."""
    out: list[tuple[str, str, str | None]] = [("direct", "direct", None)]
    for base in ([""] + (["base-"] if args.base_python else [])):
        for mode in args.gateway_modes:
            kind = base + f"gateway-{mode}"
            name = "base" if base else "gateway"
            out += [(f"{name}[{mode}]:{r}", kind, r) for r in args.routers]
    if args.floor:
        out.append(("floor", "floor", "round_robin"))
    out += [(f"sglang-router:{p}", "sglang", p) for p in args.sglang_policies]
    out += [(f"vllm-router:{p}", "vllm", p) for p in args.vllm_policies]
    return out


def start_emulator(
    ts: float, log_dir: Path, out: Path, get_load: str
) -> tuple[ServerProcess, list[str]]:
    base = free_ports(G)
    cfg = {"ranks": G, "slots": B, "time_scale": ts, "port_base": base, "log_dir": str(log_dir),
           "get_load": get_load}  # fmt: skip
    args = [sys.executable, "-m", "balanceroute.serving.testbed.emulator", json.dumps(cfg)]
    proc = ServerProcess(args, log=out, env=clean_env())
    urls = [f"http://127.0.0.1:{base + g}" for g in range(G)]
    proc.wait_ready([u + "/health" for u in urls], timeout_s=180, poll_s=0.2)
    return proc, urls


def start_router(
    kind: str, policy: str, urls: list[str], out: Path, peers: Path, base_python: str | None = None
) -> tuple[ServerProcess, str]:
    """The gateway or a peer router in front of ``urls``; its URL once it answers (a
    ``base-gateway...`` kind: the gateway of ``base_python``'s installation)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cli = CLI
    if kind.startswith("base-"):
        assert base_python is not None
        kind, cli = kind.removeprefix("base-"), [base_python, *CLI[1:]]
    if kind.startswith("gateway"):
        mode = GATEWAY_MODES[kind.partition("-")[2]]
        args = [*cli, "gateway", "--slots", str(B), "--port", str(port), "--router", policy]
        if kind.endswith("-plain"):
            env = clean_env()
        else:
            args += ["--out", str(out / "gateway"), "--no-mlflow", *mode]
            env = clean_env({"BALANCEROUTE_LOG_LEVEL": "warning"})
        for u in urls:
            args += ["--rank", u]
        ready = url + "/readyz"
    elif kind == "floor":  # the bare Python relay (bare_relay.py): the floor of the gateway's plane
        args = [sys.executable, str(Path(__file__).with_name("bare_relay.py")), "--port", str(port)]
        args += [a for u in urls for a in ("--rank", u)]
        env, ready = clean_env(), url + "/health"
    elif kind == "sglang":
        args = [str(peers / "sglang-router"), "launch", "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy, "--worker-startup-check-interval", "1", "--log-level", "warn",
                "--prometheus-port", str(free_port()), "--worker-urls", *urls]  # fmt: skip
        env, ready = clean_env(), url + "/health"
    else:
        args = [str(peers / "vllm-router"), "--host", "127.0.0.1", "--port", str(port),
                "--policy", policy, "--worker-startup-check-interval", "1", "--log-level", "warning",
                "--prometheus-port", str(free_port()), "--worker-urls", *urls]  # fmt: skip
        env, ready = clean_env(), url + "/health"
    if PIN:  # the router alone on the last CPU (``--pin``)
        args = ["taskset", "-c", str(PIN[0]), *args]
    # its own session: sglang-router forks the router process, which a stop must reach too
    # a plain gateway keeps MLflow's default store (SQLite in its working folder): the arm's own
    proc = ServerProcess(args, log=out / "router.out", env=env, group=True, cwd=out)
    proc.wait_ready([ready], timeout_s=180, poll_s=0.2)
    if kind in ("sglang", "vllm"):  # the peers answer /health before they have registered every worker
        wait_workers(proc, url)
    return proc, url


def wait_workers(proc: ServerProcess, url: str, timeout_s: float = 60.0) -> None:
    """Until the peer lists all G workers as healthy (``GET /workers``)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            body = httpx.get(url + "/workers", timeout=2.0, trust_env=False).json()
            workers = body.get("workers", []) if isinstance(body, dict) else []
            if sum(1 for w in workers if w.get("is_healthy", True)) >= G:
                return
        except (ValueError, OSError, RuntimeError):
            pass
        time.sleep(0.2)
    raise RuntimeError(f"{url} did not register {G} workers in {timeout_s:g} s: {proc.log()}")


def cpu_s(proc: psutil.Process, children: bool = True) -> tuple[float, float]:
    """User and system CPU seconds of a process and (``children``) its children."""
    user = system = 0.0
    for p in [proc, *(proc.children(recursive=True) if children else [])]:
        try:
            t = p.cpu_times()
            user, system = user + t.user, system + t.system
        except psutil.Error:
            pass
    return user, system


def run_bench(url: str, trace: Path, n: int, load: float, ts: float, out: Path) -> dict[str, Any]:
    args = [*CLI, "bench", "--trace", str(trace), "--requests", str(n), "--load", str(load),
            "--time-scale", str(ts), "--slots", str(B), "--ranks", str(G), "--out", str(out),
            "--model", DEFAULT_MODEL, "--no-progress", "--request-timeout", "900"]  # fmt: skip
    for u in url.split(","):
        args += ["--url", u]
    subprocess.run(args, check=True, stdout=subprocess.DEVNULL, env=clean_env())
    return json.loads((out / "summary.json").read_text())


def outside_engine_ms(out: Path) -> np.ndarray:
    """Per request: client TTFT minus the engine's arrival-to-first-chunk time, in ms."""
    client = pd.read_parquet(out / "bench" / "requests.parquet").set_index("request_id")["ttft_s"]
    _, rq = read_log(out / "emulator")
    rq = rq.drop_duplicates("request_id", keep=False).set_index("request_id")
    engine = rq["first_sent_s"] - rq["recv_s"]
    both = pd.concat([client, engine], axis=1, join="inner").dropna()
    return ((both.iloc[:, 0] - both.iloc[:, 1]) * 1e3).to_numpy()


def steady(out: Path) -> dict[str, Any]:
    """Live steady imbalance and busy-time throughput from the emulator's logs."""
    iterations, requests = read_log(out / "emulator")
    loads = rank_matrix(iterations, "loads").astype(np.float64)
    waiting = rank_matrix(iterations, "waiting").sum(axis=1) > 0
    ticks_file = out / "gateway" / "ticks.parquet"
    if ticks_file.exists():  # the gateway holds its queue in its pool, not at the ranks
        epoch = json.loads((out / "emulator" / "config.json").read_text())["epoch"]
        ticks = pd.read_parquet(ticks_file)
        at = np.searchsorted(ticks["time_s"].to_numpy(), epoch + iterations["start_s"].to_numpy())
        pool = np.where(at > 0, ticks["pool"].to_numpy()[np.maximum(at - 1, 0)], 0)
        waiting |= pool > 0
    imb = G * loads.max(axis=1) - loads.sum(axis=1)
    busy = float(iterations["duration_s"].sum())
    done = requests[requests["finish_reason"] != "abort"]
    return {
        "steady_imbalance": float(imb[waiting].mean()) if waiting.any() else None,
        "steady_iterations": int(waiting.sum()),
        "mean_imbalance_all": float(imb.mean()) if len(imb) else None,
        "throughput_tok_s_busy": float(done["generated"].sum()) / busy if busy else None,
        "resyncs": json.loads((out / "emulator" / "summary.json").read_text())["resyncs"],
    }


def one_arm(kind: str, policy: str | None, trace: Path, n: int, load: float, ts: float,
            out: Path, peers: Path, base_python: str | None = None) -> dict[str, Any]:  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    emu, urls = start_emulator(ts, out / "emulator", out / "emulator.out",
                               "load" if kind == "vllm" else "sglang")  # fmt: skip
    router = None
    cpu = main = system = None
    try:
        if kind == "direct":
            summary = run_bench(",".join(urls), trace, n, load, ts, out / "bench")
        else:
            assert policy is not None
            router, url = start_router(kind, policy, urls, out, peers, base_python)
            ps = psutil.Process(router.pid)
            (u0, s0), main0 = cpu_s(ps), sum(cpu_s(ps, children=False))
            summary = run_bench(url, trace, n, load, ts, out / "bench")
            (u1, s1), main = cpu_s(ps), sum(cpu_s(ps, children=False)) - main0
            cpu, system = u1 + s1 - u0 - s0, s1 - s0
    finally:
        if router is not None:
            router.terminate(60)
        emu.terminate(60)
    tokens = int(summary["total_output_tokens"])
    outside = outside_engine_ms(out)
    return {
        "completed": summary["completed"],
        "failed": summary["failed"],
        "output_tokens": tokens,
        "output_tok_s_wall": summary["output_throughput"],
        "median_ttft_ms": summary["median_ttft_ms"],
        "outside_engine_ms_p50": float(np.median(outside)) if outside.size else None,
        "router_cpu_s": cpu,
        "router_cpu_s_per_1k_tokens": (cpu / tokens * 1e3) if cpu is not None and tokens else None,
        "router_system_share": (system / cpu) if system is not None and cpu else None,
        # the router's own process (a split gateway's decider; the rest is its relay workers)
        "router_main_cpu_s_per_1k_tokens": (main / tokens * 1e3) if main is not None and tokens
        else None,
        **steady(out),
        "loadavg_before": list(load_before),
        "loadavg_after": list(os.getloadavg()),
    }


def one_load(args: argparse.Namespace, load: float, n: int, trace: Path, out: Path) -> dict:
    rows: dict[str, Any] = {}
    for name, kind, policy in arms(args):
        t0 = time.time()
        try:
            rows[name] = one_arm(kind, policy, trace, n, load, args.time_scale,
                                 out / name.replace(":", "-"), args.peers_bin,
                                 args.base_python)  # fmt: skip
        except (RuntimeError, subprocess.CalledProcessError, OSError) as exc:
            rows[name] = {"error": str(exc)[-1500:]}
        rows[name]["wall_s"] = time.time() - t0
        print(f"side_by_side: load {load:g} {name}: {json.dumps(rows[name], default=float)[:300]}",
              file=sys.stderr, flush=True)  # fmt: skip
    direct = rows.get("direct", {}).get("outside_engine_ms_p50")
    jsq = next((r.get("steady_imbalance") for name, r in rows.items()
                if name.startswith("gateway") and name.endswith(":count-jsq")), None)  # fmt: skip
    for row in rows.values():
        o, imb = row.get("outside_engine_ms_p50"), row.get("steady_imbalance")
        row["added_median_ttft_ms"] = o - direct if o is not None and direct is not None else None
        row["imbalance_vs_gateway_count_jsq"] = imb / jsq if imb is not None and jsq else None
    peers = [r for name, r in rows.items() if name.split(":")[0] in ("sglang-router", "vllm-router")]
    ttfts = [r["added_median_ttft_ms"] for r in peers if r.get("added_median_ttft_ms") is not None]
    cpus = [r["router_cpu_s_per_1k_tokens"] for r in peers
            if r.get("router_cpu_s_per_1k_tokens")]  # fmt: skip
    for row in rows.values():  # against the best peer of this run (issue 20's targets)
        t, c = row.get("added_median_ttft_ms"), row.get("router_cpu_s_per_1k_tokens")
        row["added_ttft_over_best_peer_ms"] = t - min(ttfts) if t is not None and ttfts else None
        row["cpu_per_1k_vs_best_peer"] = c / min(cpus) if c is not None and cpus else None
    return {"load": load, "requests": n, "arms": rows}


def _f(v: Any, fmt: str = ".2f") -> str:
    return "n/a" if v is None else format(v, fmt)


def render(result: dict[str, Any]) -> str:
    """Markdown tables of a saved result."""
    lines = []
    for run in result["runs"]:
        lines += [
            f"Load {run['load']:g} of capacity, {run['requests']} requests:",
            "",
            "| arm | added TTFT p50 (ms) | output tok/s (wall) | tok/s (busy) | steady imbalance "
            "(/ count-jsq) | router CPU s / 1k tok (/ best peer) | failed | load avg after |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for name, r in run["arms"].items():
            if "error" in r:
                lines.append(f"| `{name}` | error: {r['error'][:80]} | | | | | | |")
                continue
            lines.append(
                f"| `{name}` | {_f(r['added_median_ttft_ms'])} | {_f(r['output_tok_s_wall'], ',.0f')}"
                f" | {_f(r['throughput_tok_s_busy'], ',.0f')} | {_f(r['steady_imbalance'], ',.0f')} "
                f"({_f(r['imbalance_vs_gateway_count_jsq'])}) | {_f(r['router_cpu_s_per_1k_tokens'], '.3f')}"
                f" ({_f(r.get('cpu_per_1k_vs_best_peer'))})"
                f" | {r['failed']} | {_f(r['loadavg_after'][0], '.1f')} |"
            )
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--render", metavar="JSON", help="print the tables of a saved result, then stop")
    p.add_argument("--out", default="runs/side_by_side")
    p.add_argument("--trace", default=str(DATA / TRACE), help="a trace (default: shared Azure)")
    p.add_argument("--skip", type=int, default=3000, help="trace rows skipped before the replay")
    p.add_argument("--loads", type=lambda t: [float(x) for x in t.split(",")], default=[0.2, 1.1])
    p.add_argument("--requests", type=lambda t: [int(x) for x in t.split(",")], default=[150, 600],
                   help="requests per load, in --loads order")  # fmt: skip
    p.add_argument("--time-scale", type=float, default=1.0)
    p.add_argument("--routers", type=lambda t: [x for x in t.split(",") if x],
                   default=list(GATEWAY_ROUTERS))  # fmt: skip
    p.add_argument("--gateway-modes", type=lambda t: [x for x in t.split(",") if x],
                   default=["inproc"],
                   help=f"gateway layouts, of {', '.join(GATEWAY_MODES)} (default: inproc, the "
                   "gateway's default)")  # fmt: skip
    p.add_argument("--sglang-policies", type=lambda t: [x for x in t.split(",") if x],
                   default=list(SGLANG_POLICIES))  # fmt: skip
    p.add_argument("--vllm-policies", type=lambda t: [x for x in t.split(",") if x],
                   default=list(VLLM_POLICIES))  # fmt: skip
    p.add_argument("--floor", action="store_true", help="also the arm 'floor': bare_relay.py, "
                   "the fewest steps a Python relay takes (round robin, no checks, no decision)")
    p.add_argument(
        "--pin",
        action="store_true",
        help="the router (gateway, peer or floor) alone on the last CPU, the emulator and the "
        "client on the others",
    )
    p.add_argument("--peers-bin", type=Path, help="folder with sglang-router and vllm-router")
    p.add_argument("--base-python", help="another installation's python (e.g. a worktree of main "
                   "with its own .venv): every gateway arm again with its gateway, as base[MODE]")  # fmt: skip
    args = p.parse_args()
    if args.render:
        print(render(json.loads(Path(args.render).read_text())))
        return
    bad = [m for m in args.gateway_modes if m not in GATEWAY_MODES]
    if bad:
        p.error(f"--gateway-modes: unknown {bad}; known: {', '.join(GATEWAY_MODES)}")
    if len(args.requests) != len(args.loads):
        p.error(f"--requests needs one count per load ({len(args.loads)}), got {args.requests}")
    if args.peers_bin is None:
        found = subprocess.run([str(REPO / "scripts" / "install_peers.sh")], check=True,
                               capture_output=True, text=True)  # fmt: skip
        args.peers_bin = Path(found.stdout.strip().splitlines()[-1])
    if args.pin:
        pin_router()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    frame, _ = load_workload(WorkloadSpec(trace=args.trace))
    top = max(args.requests)
    replay = frame.iloc[args.skip : args.skip + top].reset_index(drop=True)
    replay["arrival_s"] = replay["arrival_s"] - replay["arrival_s"].iloc[0]
    trace = write_trace(replay, out / "replay.parquet")
    t0 = time.time()
    result: dict[str, Any] = {
        "G": G, "B": B, "time_scale": args.time_scale, "trace": Path(args.trace).name,
        "skip": args.skip, "peers_bin": str(args.peers_bin), "cpus": os.cpu_count(), "pin": PIN[:1],
        "loadavg_before": list(os.getloadavg()), "runs": [],
    }  # fmt: skip
    for load, n in zip(args.loads, args.requests, strict=True):
        result["runs"].append(one_load(args, load, n, Path(trace), out / f"load-{load:g}"))
    result["wall_s"] = time.time() - t0
    result["loadavg_after"] = list(os.getloadavg())
    print(json.dumps(result, indent=2, default=float))


if __name__ == "__main__":
    main()

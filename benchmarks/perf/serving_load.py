"""Load benchmark: ``balanceroute serve`` against MLflow's scoring server, same registered models.

One run, one machine, one client for both servers: batches of ``--batch`` running requests (512)
from a synthetic trace, pre-encoded for each server (ours: ``POST /v1/predict``; MLflow's:
``POST /invocations`` with ``dataframe_split``), sent over keep-alive ``http.client`` connections
by 1 client and by 8 concurrent client threads for ``--seconds`` each. Reported per server, kind
and concurrency: median and p99 latency, requests/s, errors; the server's RSS with one model
loaded (MLflow's: its uvicorn process); and whether both servers give the same predictions.

The models come from the MLflow registry at ``--tracking-uri`` (default: a SQLite store in the
work folder); when ``completion-predictor`` lacks an alias per kind, ``balanceroute train``
registers them first. Prints JSON (also written to ``--out`` if given)::

    .venv/bin/python benchmarks/perf/serving_load.py --seconds 5 --out runs/serving_load.json
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil

from balanceroute.features.synthetic import generate
from balanceroute.predict.model_store import load_file
from balanceroute.serving.service.decode import decode_predict
from balanceroute.serving.service.inference import running_batch
from balanceroute.serving.testbed.harness import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
MODEL = "completion-predictor"
KINDS = ("gbdt", "survival", "exactmatch")
TARGETS = {
    "throughput_ratio": 5.0,
    "p99_ms": {"gbdt": 15.0, "survival": 5.0, "exactmatch": 5.0},
    "rss_mb": 400.0,
}


def log(msg: str) -> None:
    """Progress on stderr (stdout is the JSON report)."""
    print(f"[serving_load] {msg}", file=sys.stderr, flush=True)


# ---- models ------------------------------------------------------------------------------------


def registered_kinds(env: dict[str, str]) -> set[str]:
    """Kinds that have an alias on the registered model (asked in a subprocess: mlflow stays out)."""
    code = (
        "import json, sys\n"
        "from mlflow.tracking import MlflowClient\n"
        "c = MlflowClient(); out = []\n"
        f"for k in {list(KINDS)!r}:\n"
        "    try:\n"
        f"        c.get_model_version_by_alias({MODEL!r}, k); out.append(k)\n"
        "    except Exception:\n"
        "        pass\n"
        "print(json.dumps(out))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    return set(json.loads(done.stdout.strip().splitlines()[-1])) if done.returncode == 0 else set()


def ensure_models(env: dict[str, str], workdir: Path, requests: int, retrain: bool) -> None:
    """Train and register every kind with ``balanceroute train`` unless already registered."""
    if not retrain and registered_kinds(env) >= set(KINDS):
        log("models already registered")
        return
    log(f"training {', '.join(KINDS)} on {requests} synthetic requests (balanceroute train)")
    args = [
        sys.executable,
        "-m",
        "balanceroute.cli",
        "train",
        "--requests",
        str(requests),
        "--out",
        str(workdir / "artifacts"),
    ]
    subprocess.run(args, cwd=workdir, env=env, check=True, stdout=subprocess.DEVNULL)


# ---- workload ----------------------------------------------------------------------------------


def make_batches(batch: int, count: int, seed: int) -> list[dict[str, Any]]:
    """Running requests of a synthetic trace at random ages below their lengths."""
    frame = generate("paper-prod", batch * count, seed=seed)
    rng = np.random.default_rng(seed)
    age = (rng.random(len(frame)) * frame["output_tokens"].to_numpy()).astype(np.int64)
    prompt = frame["prompt_tokens"].to_numpy()
    keys = frame["prompt_key"].astype(str).tolist()
    out = []
    for b in range(count):
        sl = slice(b * batch, (b + 1) * batch)
        rows = list(zip(prompt[sl].tolist(), age[sl].tolist(), keys[sl], strict=True))
        ours = {
            "requests": [
                {"id": j, "prompt_tokens": p, "age": a, "prompt_key": k}
                for j, (p, a, k) in enumerate(rows)
            ]
        }
        theirs = {
            "dataframe_split": {
                "columns": ["prompt_tokens", "age", "prompt_key"],
                "data": [list(r) for r in rows],
            }
        }
        out.append({"ours": orjson.dumps(ours), "mlflow": orjson.dumps(theirs)})
    return out


# ---- servers -----------------------------------------------------------------------------------


class Process:
    """A server subprocess in its own process group (MLflow execs workers), polled until ready."""

    def __init__(
        self, name: str, args: list[str], env: dict[str, str], ready: str, cwd: Path, port: int
    ) -> None:
        self.name = name
        self.port = port
        self.log_path = cwd / f"{name}-{port}.log"
        start = time.monotonic()
        self.server = ServerProcess(args, log=self.log_path, env=env, cwd=cwd, group=True)
        self.proc = self.server.proc
        self.server.wait_ready([f"http://127.0.0.1:{port}{ready}"], timeout_s=300, poll_s=0.2)
        self.startup_s = time.monotonic() - start

    def rss_mb(self) -> float:
        """Resident memory of the serving process (the deepest one: MLflow execs uvicorn)."""
        proc = psutil.Process(self.proc.pid)
        tree = [proc, *proc.children(recursive=True)]
        return round(tree[-1].memory_info().rss / 2**20, 1)

    def stop(self) -> None:
        """Terminate the server and the processes it started (its process group), reap them."""
        self.server.terminate(timeout_s=15)


def start_ours(uri: str, env: dict[str, str], cwd: Path) -> Process:
    """``balanceroute serve`` on a free port (its default settings unless ``env`` says)."""
    port = free_port()
    args = [
        sys.executable,
        "-m",
        "balanceroute.cli",
        "serve",
        "--model-uri",
        uri,
        "--port",
        str(port),
    ]
    return Process("balanceroute", args, env, "/readyz", cwd, port)


def start_mlflow(kind: str, env: dict[str, str], cwd: Path) -> Process:
    """``mlflow models serve --env-manager local`` of the same registered version."""
    port = free_port()
    mlflow = shutil.which("mlflow", path=env["PATH"]) or "mlflow"
    args = [
        mlflow,
        "models",
        "serve",
        "-m",
        f"models:/{MODEL}@{kind}",
        "--env-manager",
        "local",
        "--port",
        str(port),
        "--host",
        "127.0.0.1",
    ]
    return Process("mlflow", args, env, "/ping", cwd, port)


# ---- load --------------------------------------------------------------------------------------


def call(conn: http.client.HTTPConnection, path: str, body: bytes) -> tuple[int, bytes]:
    """One POST on a kept-alive connection: status and body."""
    conn.request("POST", path, body=body, headers={"content-type": "application/json"})
    resp = conn.getresponse()
    return resp.status, resp.read()


def load(port: int, path: str, bodies: list[bytes], clients: int, seconds: float) -> dict:
    """``clients`` threads, each on its own keep-alive connection, for ``seconds``."""
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors = [0] * clients
    start_gate = threading.Barrier(clients + 1)
    stop_at = [0.0]

    def worker(i: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for j in range(10):  # warm-up, not measured
            call(conn, path, bodies[(i + j) % len(bodies)])
        start_gate.wait()
        j = i
        while time.perf_counter() < stop_at[0]:
            t0 = time.perf_counter()
            status, _ = call(conn, path, bodies[j % len(bodies)])
            latencies[i].append((time.perf_counter() - t0) * 1e3)
            errors[i] += status != 200
            j += 1
        conn.close()

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    stop_at[0] = time.perf_counter() + 3600
    start_gate.wait()
    t0 = time.perf_counter()
    stop_at[0] = t0 + seconds
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    lat = np.concatenate([np.asarray(x) for x in latencies])
    return {
        "clients": clients,
        "requests": int(lat.size),
        "errors": int(sum(errors)),
        "requests_per_s": round(lat.size / wall, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2),
        "p99_ms": round(float(np.percentile(lat, 99)), 2),
        "mean_ms": round(float(lat.mean()), 2),
    }


def model_floor(path: Path, bodies: list[bytes], repeats: int = 50) -> dict[str, float]:
    """The estimator alone, in this process, on the same batches: what no server can beat."""
    est = load_file(path)
    batches = [running_batch(decode_predict(orjson.loads(b), 16_384).running, None) for b in bodies]
    for batch in batches[:3]:  # the first calls load compiled kernels: not what a server sees
        est.predict(batch)
    times = []
    for j in range(repeats):
        t0 = time.perf_counter()
        est.predict(batches[j % len(batches)])
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "p50_ms": round(float(np.percentile(times, 50)), 2),
        "p99_ms": round(float(np.percentile(times, 99)), 2),
    }


def agreement(ours: Process, theirs: Process, batch: dict[str, bytes]) -> float:
    """Largest |p_finish| difference between the two servers on one batch."""
    a = orjson.loads(
        call(http.client.HTTPConnection("127.0.0.1", ours.port), "/v1/predict", batch["ours"])[1]
    )
    b = orjson.loads(
        call(http.client.HTTPConnection("127.0.0.1", theirs.port), "/invocations", batch["mlflow"])[
            1
        ]
    )
    rows = b["predictions"]
    theirs_p = (
        np.array([r["p_finish"] for r in rows])
        if isinstance(rows, list)
        else np.array(rows["p_finish"])
    )
    return float(np.abs(np.array(a["p_finish"]) - theirs_p).max())


# ---- the run -----------------------------------------------------------------------------------


def run(args: argparse.Namespace) -> dict[str, Any]:
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="serving_load-")).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    tracking = (
        args.tracking_uri
        or os.environ.get("MLFLOW_TRACKING_URI")
        or (f"sqlite:///{workdir / 'mlflow.db'}")
    )
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("BALANCEROUTE_")},
        "MLFLOW_TRACKING_URI": tracking,
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    ensure_models(env, workdir, args.train_requests, args.retrain)
    batches = make_batches(args.batch, args.batches, args.seed)
    ours_bodies = [b["ours"] for b in batches]
    results: list[dict[str, Any]] = []
    rss: dict[str, float] = {}
    startup: dict[str, float] = {}

    def measure(server: Process, name: str, kind: str, path: str, bodies: list[bytes]) -> None:
        for clients in (1, 8):
            log(f"{name} {kind}: {clients} client(s) for {args.seconds} s")
            row = load(server.port, path, bodies, clients, args.seconds)
            results.append({"server": name, "kind": kind, **row})
        rss[f"{name}:{kind}"] = server.rss_mb()
        startup[f"{name}:{kind}"] = round(server.startup_s, 1)

    agree = None
    for kind in KINDS:
        ours = start_ours(f"models:/{MODEL}@{kind}", env, workdir)
        try:
            measure(ours, "balanceroute", kind, "/v1/predict", ours_bodies)
            if kind in args.mlflow_kinds:
                theirs = start_mlflow(kind, env, workdir)
                try:
                    measure(theirs, "mlflow", kind, "/invocations", [b["mlflow"] for b in batches])
                    if kind == "gbdt":
                        agree = agreement(ours, theirs, batches[0])
                finally:
                    theirs.stop()
        finally:
            ours.stop()
    floor = {
        kind: model_floor(workdir / "artifacts" / f"{kind}.joblib", ours_bodies)
        for kind in KINDS
        if (workdir / "artifacts" / f"{kind}.joblib").is_file()
    }
    predict_only = start_ours(
        f"models:/{MODEL}@gbdt", {**env, "BALANCEROUTE_WARM_ROUTER": "false"}, workdir
    )
    try:
        load(predict_only.port, "/v1/predict", ours_bodies, 8, min(args.seconds, 3.0))
        rss["balanceroute:gbdt (predict only: router never loaded)"] = predict_only.rss_mb()
    finally:
        predict_only.stop()
    return {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "load_average_at_end": [round(x, 2) for x in os.getloadavg()],
        },
        "batch": args.batch,
        "seconds_per_run": args.seconds,
        "tracking_uri": tracking,
        "results": results,
        "rss_mb": rss,
        "startup_s": startup,
        "estimator_only_in_process": floor,
        "gbdt_max_abs_diff_p_finish_vs_mlflow": agree,
        "targets": targets(results, rss),
    }


def targets(results: list[dict[str, Any]], rss: dict[str, float]) -> dict[str, Any]:
    """Each target of the issue with the measured value and whether it holds."""

    def row(server: str, kind: str, clients: int) -> dict[str, Any] | None:
        return next(
            (
                r
                for r in results
                if (r["server"], r["kind"], r["clients"]) == (server, kind, clients)
            ),
            None,
        )

    out: dict[str, Any] = {}
    for clients in (1, 8):
        ours, theirs = row("balanceroute", "gbdt", clients), row("mlflow", "gbdt", clients)
        if ours and theirs:
            ratio = ours["requests_per_s"] / max(theirs["requests_per_s"], 1e-9)
            out[f"throughput_ratio_gbdt_{clients}_clients"] = {
                "value": round(ratio, 2),
                "target": TARGETS["throughput_ratio"],
                "met": ratio >= TARGETS["throughput_ratio"],
            }
    for kind, limit in TARGETS["p99_ms"].items():
        ours = row("balanceroute", kind, 1)
        if ours:
            out[f"p99_ms_{kind}_1_client"] = {
                "value": ours["p99_ms"],
                "target": limit,
                "met": ours["p99_ms"] <= limit,
            }
    for key, value in rss.items():
        if key.startswith("balanceroute:"):
            out[f"rss_mb {key}"] = {
                "value": value,
                "target": TARGETS["rss_mb"],
                "met": value <= TARGETS["rss_mb"],
            }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=512, help="running requests per call")
    p.add_argument("--batches", type=int, default=16, help="distinct batches cycled through")
    p.add_argument("--seconds", type=float, default=5.0, help="duration of each load run")
    p.add_argument("--train-requests", type=int, default=4000, help="trace size if training")
    p.add_argument(
        "--mlflow-kinds",
        default="gbdt",
        type=lambda s: s.split(","),
        help="kinds also served by MLflow's scoring server (comma-separated)",
    )
    p.add_argument("--tracking-uri", help="MLflow store holding completion-predictor")
    p.add_argument("--retrain", action="store_true", help="register fresh versions first")
    p.add_argument("--workdir", help="folder for the store, artifacts and server logs")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", help="also write the JSON here")
    args = p.parse_args()
    report = run(args)
    text = json.dumps(report, indent=2)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()

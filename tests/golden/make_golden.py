"""Write the golden outputs of release 0.1.0 that ``tests/test_golden.py`` holds later code to.

Run once, by release 0.1.0 (commit 282240f, before the package moved under the
``balanceroute`` namespace), from the repository root:

    .venv/bin/python tests/golden/make_golden.py

It writes, next to this file:

- ``ab/summary.json``: ``balanceroute ab`` on a seeded synthetic workload (see ``AB_ARGS``);
- ``models/*.joblib``: ``survival``, ``exactmatch`` and ``gbdt`` fitted on a seeded trace and
  saved by that release (so later releases must still read them);
- ``predictions.npz``: those models' answers on fixed snapshots, before and after online updates;
- ``evaluate/metrics.json``: ``balanceroute evaluate`` of the saved gbdt model.

- ``service.json``: a real ``balanceroute serve`` process's answers to ``SERVICE_CALLS``, with
  the saved ``survival`` and ``gbdt`` models as arms a and b.
Regenerating these files is a deliberate change of behaviour, never a way to make a test pass.
A later release that changes behaviour on purpose regenerates only the parts it changes, e.g.

    .venv/bin/python tests/golden/make_golden.py --only ab,service

(the saved models and their predictions stay those of release 0.1.0).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

AB_ARGS = [
    "ab",
    "--preset",
    "mooncake-conv",
    "--requests",
    "1500",
    "--seed",
    "7",
    "--arms",
    "count-jsq,token-jsq,random,round-robin,p2c,br0,brh-paper:oracle,brh:none,brh:survival,"
    "brh:exactmatch,brh:gbdt,brh:oracle{refresh=4;projection=expected}",
    "--workers",
    "4,8",
    "--slots",
    "16",
    "--repeats",
    "2",
    "--load",
    "1.1",
    "--no-mlflow",
]
EVALUATE_ARGS = ["evaluate", "--preset", "mooncake-conv", "--requests", "1500", "--seed", "7"]
TRACE = ("mooncake-conv", 1500, 7)
MODEL_PARAMS = {
    "survival": {"window": 8192},
    "exactmatch": {"window": 8192},
    "gbdt": {"window": 8192, "n_estimators": 30, "per_request": 8},
}
SNAPSHOTS = 150


def predictions(est, snap: dict[str, np.ndarray], kind: str) -> dict[str, np.ndarray]:
    """``est``'s answers on the snapshots (probabilities, expectations, curves), when fitted
    and again after observing the snapshots' completions."""
    from balanceroute.predict.base import CompletedBatch, RunningBatch

    out = {}
    batch = RunningBatch(snap["prompt"], snap["age"], snap["key"], time_s=2e4)
    for stage in ("fitted", "observed"):
        curves = est.predict(batch, survival=True)
        plain = est.predict(batch)
        out[f"{kind}_{stage}_p"] = plain.p_finish
        out[f"{kind}_{stage}_c"] = plain.c
        out[f"{kind}_{stage}_survival"] = curves.survival
        est.observe(
            CompletedBatch(
                snap["done_prompt"], snap["done_output"], snap["done_key"], snap["done_time"]
            )
        )
    return out


def snapshots(trace) -> dict[str, np.ndarray]:
    """Fixed (prompt, age, key) rows drawn from the trace, plus completions to observe."""
    from balanceroute.features.schema import to_arrays

    arrays = to_arrays(trace)
    rng = np.random.default_rng(11)
    idx = rng.integers(0, arrays.size, SNAPSHOTS)
    age = np.floor(rng.random(SNAPSHOTS) * arrays.output_tokens[idx] * 1.5).astype(np.int64)
    done = rng.integers(0, arrays.size, 300)
    return {
        "prompt": arrays.prompt_tokens[idx],
        "age": age,
        "key": arrays.prompt_key[idx],
        "done_prompt": arrays.prompt_tokens[done],
        "done_output": arrays.output_tokens[done],
        "done_key": arrays.prompt_key[done],
        "done_time": np.sort(rng.random(300) * 100.0 + 1e4),
    }


def service_calls(snap: dict[str, np.ndarray]) -> list[tuple[str, dict]]:
    """The bodies posted to the service, in order (observe between predicts, then routes)."""
    rows = [
        {"id": i, "prompt_tokens": int(p), "age": int(a), "prompt_key": int(k)}
        for i, (p, a, k) in enumerate(zip(snap["prompt"], snap["age"], snap["key"], strict=True))
    ]
    done = [
        {"prompt_tokens": int(p), "output_tokens": int(o), "prompt_key": int(k), "time_s": float(t)}
        for p, o, k, t in zip(
            snap["done_prompt"],
            snap["done_output"],
            snap["done_key"],
            snap["done_time"],
            strict=True,
        )
    ]
    workers = [
        {"free_slots": 2, "running": rows[0:6]},
        {"free_slots": 1, "running": rows[6:14]},
        {"free_slots": 3, "running": rows[14:17]},
    ]
    pool = [
        {"id": f"p{j}", "prompt_tokens": int(p), "prompt_key": int(k), "waited_s": 0.1 * j}
        for j, (p, k) in enumerate(zip(snap["prompt"][20:40], snap["key"][20:40], strict=True))
    ]
    calls: list[tuple[str, dict]] = [
        ("/v1/predict", {"requests": rows, "survival": True, "time_s": 2e4}),
        ("/v1/predict", {"requests": rows, "model": "b", "time_s": 2e4}),
        ("/v1/predict", {"requests": rows[:50], "model": "b", "horizon": 40, "survival": True}),
        ("/v1/observe", {"completions": done}),
        ("/v1/predict", {"requests": rows, "model": "b", "survival": True, "time_s": 3e4}),
    ]
    for policy, options, model in (
        ("count-jsq", None, None),
        ("token-jsq", None, None),
        ("br0", None, None),
        ("brh", None, "a"),
        ("brh", {"horizon": 40, "gamma": 0.9, "auto_gamma": None, "s_greedy": 2}, "b"),
        ("brh-paper", None, "b"),
    ):
        body = {"policy": policy, "workers": workers, "pool": pool, "iteration": 5, "time_s": 3e4}
        if options is not None:
            body["options"] = options
        if model is not None:
            body["model"] = model
        calls.append(("/v1/route", body))
    return calls


def record_service(snap: dict[str, np.ndarray], module: list[str]) -> list[dict]:
    """Start the service with the saved models and record its answers to :func:`service_calls`."""
    import json

    import httpx

    from balanceroute.serving.testbed.harness import ServerProcess, clean_env, free_port

    port = free_port()
    env = clean_env(
        {
            "BALANCEROUTE_MODEL_URI": str(HERE / "models" / "survival.joblib"),
            "BALANCEROUTE_MODEL_URI_B": str(HERE / "models" / "gbdt.joblib"),
            "BALANCEROUTE_PORT": str(port),
        },
        drop_prefix="BALANCEROUTE_",
    )
    server = ServerProcess([sys.executable, "-m", *module], cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        server.wait_ready([url + "/readyz"], timeout_s=90)
        answers = []
        with httpx.Client(base_url=url, timeout=30, trust_env=False) as client:
            for path, body in service_calls(snap):
                r = client.post(path, content=json.dumps(body))
                answers.append({"path": path, "status": r.status_code, "body": r.json()})
        return answers
    finally:
        server.kill()


PARTS = ("models", "service", "ab", "evaluate")


def record_ab() -> None:
    """``ab/summary.json``: the A/B run of ``AB_ARGS`` with the current code."""
    cli = [sys.executable, "-m", "balanceroute.cli"]
    subprocess.run([*cli, *AB_ARGS, "--out", str(HERE / "ab")], check=True, cwd=ROOT)
    for name in ("report.md", "trajectories.png", "imbalance_distribution.png", "scaling.png"):
        (HERE / "ab" / name).unlink(missing_ok=True)


def main() -> None:
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help=f"comma-separated parts to regenerate: {', '.join(PARTS)}")
    args = ap.parse_args()
    if args.only is not None:
        parts = args.only.split(",")
        unknown = sorted(set(parts) - set(PARTS))
        if unknown:
            raise SystemExit(f"unknown part(s) {unknown}; known: {', '.join(PARTS)}")
        from balanceroute.features.synthetic import generate

        if "models" in parts or "evaluate" in parts:
            raise SystemExit("the saved models and their evaluation are release 0.1.0's: keep them")
        if "service" in parts:
            snap = snapshots(generate(TRACE[0], TRACE[1], seed=TRACE[2]))
            answers = record_service(snap, ["balanceroute.serving.service"])
            (HERE / "service.json").write_text(json.dumps(answers, indent=1) + "\n")
        if "ab" in parts:
            record_ab()
        return
    sys.path.insert(0, str(ROOT))
    from balanceroute.features.synthetic import generate
    from balanceroute.predict.registry import make_estimator

    out = HERE / "models"
    out.mkdir(parents=True, exist_ok=True)
    trace = generate(TRACE[0], TRACE[1], seed=TRACE[2])
    snap = snapshots(trace)
    arrays = dict(snap)
    for kind, params in MODEL_PARAMS.items():
        est = make_estimator(kind, **params).fit(trace)
        est.save(out / f"{kind}.joblib")
        arrays.update(predictions(est, snap, kind))
    np.savez_compressed(HERE / "predictions.npz", **arrays)
    import json

    answers = record_service(snap, ["serving"])
    (HERE / "service.json").write_text(json.dumps(answers, indent=1) + "\n")
    cli = [sys.executable, "-m", "balanceroute.cli"]
    subprocess.run([*cli, *AB_ARGS, "--out", str(HERE / "ab")], check=True, cwd=ROOT)
    for name in ("report.md", "trajectories.png", "imbalance_distribution.png", "scaling.png"):
        (HERE / "ab" / name).unlink(missing_ok=True)
    subprocess.run(
        [
            *cli,
            *EVALUATE_ARGS,
            "--model-uri",
            str(out / "gbdt.joblib"),
            "--out",
            str(HERE / "evaluate"),
        ],
        check=True,
        cwd=ROOT,
    )
    for name in ("reliability.png", "brier_by_age.png"):
        (HERE / "evaluate" / name).unlink(missing_ok=True)


if __name__ == "__main__":
    main()

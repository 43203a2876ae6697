"""The one model lifecycle: a renewed model has learned the recent completions, a model failing
its health check is never swapped in, and a registry model is loaded in a child process."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from balanceroute.predict.base import CompletedBatch, CompletionEstimator, RunningBatch
from balanceroute.predict.model_store import load_file
from balanceroute.serving.lifecycle import renew as renew_module
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.lifecycle.renew import ReloadOutcome, renew
from balanceroute.serving.lifecycle.sources import Resolved

UNSEEN_KEY = 777_777


def recent_of_one_key(n: int = 300, output: int = 1500) -> RecentCompletions:
    """``n`` completions of one prompt key no model has seen, all ``output`` tokens long."""
    ring = RecentCompletions(1024)
    ring.add(
        CompletedBatch(
            np.full(n, 100, dtype=np.int64),
            np.full(n, output, dtype=np.int64),
            np.full(n, UNSEEN_KEY, dtype=np.uint64),
            np.arange(n, dtype=np.float64),
        )
    )
    return ring


def c_of_the_key(est: CompletionEstimator) -> np.ndarray:
    """The expected remaining tokens of a fresh request with the recent completions' key."""
    batch = RunningBatch(
        prompt_tokens=np.array([100], dtype=np.int64),
        age=np.array([0], dtype=np.int64),
        prompt_key=np.array([UNSEEN_KEY], dtype=np.uint64),
    )
    return est.predict(batch).c


def run_renew(path: Path, ring: RecentCompletions) -> tuple[ReloadOutcome, list]:
    installed: list[tuple[Resolved, CompletionEstimator]] = []

    def install(resolved: Resolved, est: CompletionEstimator) -> None:
        installed.append((resolved, est))

    outcome = asyncio.run(renew("a", str(path), None, force=True, recent=ring, install=install))
    return outcome, installed


def test_a_renewed_model_has_learned_the_recent_completions(model_dir: Path) -> None:
    path = model_dir / "exactmatch.joblib"
    as_loaded = c_of_the_key(load_file(path))  # first: compiles the kernels the canary times
    outcome, installed = run_renew(path, recent_of_one_key())
    assert outcome.changed and outcome.error is None and outcome.status == "swapped"
    assert len(installed) == 1 and installed[0][0].version == outcome.version
    renewed = c_of_the_key(installed[0][1])
    assert not np.allclose(renewed, as_loaded)
    assert abs(renewed[0] - 1500) < abs(as_loaded[0] - 1500)  # towards what it was taught


def test_a_model_failing_its_health_check_is_not_swapped(
    model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(renew_module, "health_problem", lambda est: "answers nonsense")
    outcome, installed = run_renew(model_dir / "survival.joblib", recent_of_one_key())
    assert installed == []
    assert outcome.status == "failed" and not outcome.changed and outcome.version is None
    assert "fails its health check: answers nonsense" in (outcome.error or "")


def test_a_broken_file_is_not_swapped(tmp_path: Path) -> None:
    bad = tmp_path / "bad.joblib"
    bad.write_bytes(b"not a pickle")
    outcome, installed = run_renew(bad, RecentCompletions(8))
    assert installed == [] and outcome.status == "failed"


GATEWAY_RELOAD = textwrap.dedent(
    """
    import asyncio, json, sys
    from balanceroute.predict.factory import EstimatorSpec
    from balanceroute.predict.no_prediction import NoPrediction
    from balanceroute.router.policies.specs import RouterSpec
    from balanceroute.serving.gateway.arms import Arm, Handle
    from balanceroute.serving.gateway.reload import reload_arms
    from balanceroute.serving.lifecycle.recent import RecentCompletions

    base = RouterSpec.parse("brh")
    spec = RouterSpec(base.router, EstimatorSpec.parse(sys.argv[1]), dict(base.options))
    handle = Handle(NoPrediction().fit())
    arm = Arm("brh", spec, spec.build_policy(handle), handle)
    [outcome] = asyncio.run(reload_arms([arm], RecentCompletions(8)))
    print(json.dumps({"error": outcome.error, "mlflow": "mlflow" in sys.modules}))
    """
)


def test_the_gateway_reloads_a_registry_model_without_importing_mlflow(tmp_path: Path) -> None:
    pytest.importorskip("mlflow")
    env = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
           "MLFLOW_DISABLE_TELEMETRY": "true"}  # fmt: skip
    uri = "models:/completion-predictor@nowhere"
    done = subprocess.run(
        [sys.executable, "-c", GATEWAY_RELOAD, f"exactmatch@{uri}"],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["error"] and f"cannot load {uri}" in answer["error"]  # the child asked MLflow
    assert answer["mlflow"] is False

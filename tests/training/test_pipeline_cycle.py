"""``balanceroute pipeline``: a cycle promotes with lineage, has nothing to do without new
requests, and a step that fails for real (an unreadable log, an unreachable or failing reload
target) moves no alias, with the step named and its exit code."""

from __future__ import annotations

import json
import os
import shutil
import signal
from pathlib import Path

import mlflow
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from mlflow import MlflowClient

from balanceroute.features.synthetic import generate
from balanceroute.predict.live_quality import HOLDOUT_BRIER_TAG, identity, stamp
from balanceroute.predict.model_store import load_estimator
from balanceroute.serving.lifecycle.sources import resolve_registry
from balanceroute.training.log_window import WINDOW_END_TAG
from balanceroute.training.pipeline import (
    CycleResult,
    Outcome,
    PipelineConfig,
    StepFailed,
    run_loop,
)
from balanceroute.training.twin_judge import twin_verdict
from tests.training.conftest import run_cli

MODEL = "completion-predictor"
FAST = ["--window-rows", "1200", "--group", "2x4", "--twin-windows", "4"]


def write_log(folder: Path, rows: int, first: int = 0) -> Path:
    """A gateway-style completion log: rows ``first..rows-1`` of one synthetic trace as a part,
    and the clock's origin in ``log.json``."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "log.json").write_text(json.dumps({"origin_epoch_s": 1.7e9}))
    f = generate("azure-conv", rows, seed=1).iloc[first:]
    cols = {
        c: f[c].to_numpy() for c in ("request_id", "arrival_s", "prompt_tokens", "output_tokens")
    }
    cols["prompt_key"] = f["prompt_key"].astype(str).to_numpy()
    pq.write_table(pa.table(cols), folder / f"part-{first:013d}-00000.parquet")
    return folder


def _aliases() -> dict[str, str]:
    return dict(MlflowClient().get_registered_model(MODEL).aliases)


def _cycle(log: Path, capsys, *extra: str) -> tuple[int, dict, str]:
    code = run_cli(["pipeline", "--log", str(log), *FAST, *extra])
    out, err = capsys.readouterr()
    return code, json.loads(out) if out.strip() else {}, err


@pytest.fixture
def promoted(isolated, capsys) -> Path:
    """A log of 1,200 requests and a first cycle that made ``survival`` the champion."""
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")
    log = write_log(isolated / "log", 1200)
    code, res, err = _cycle(log, capsys, "--estimators", "survival")
    assert code == 0 and res["outcome"] == "promoted", err[-2000:]
    assert "pipeline step register: done" in err and "Z [balanceroute]" in err
    return log


def test_a_cycle_registers_lineage_and_then_has_nothing_to_do(promoted, capsys) -> None:
    version = MlflowClient().get_model_version_by_alias(MODEL, "champion")
    tags = version.tags
    assert float(tags[HOLDOUT_BRIER_TAG]) > 0 and tags["kind"] == "survival"
    # the drift gauge's reference: saved with the estimator and read from the registry at load
    uri = f"models:/{MODEL}@champion"
    est = load_estimator(uri)
    assert est.holdout_brier_ == pytest.approx(float(tags[HOLDOUT_BRIER_TAG]))
    resolved = resolve_registry(uri)
    # the population the live gauges score: each holdout request at admission, not at all ages
    assert resolved.metrics["brier_at_admission"] == pytest.approx(float(tags[HOLDOUT_BRIER_TAG]))
    assert resolved.metrics["brier_at_admission"] != resolved.metrics["brier"]
    stamp(est, resolved.name, resolved.version, resolved.metrics)
    assert identity(est).holdout_brier == pytest.approx(float(tags[HOLDOUT_BRIER_TAG]))
    assert identity(est).version == str(version.version)
    assert tags["pipeline.window_rows"] == "1200" and tags["pipeline.log"] == str(promoted)
    assert tags["pipeline.code_version"].startswith("0.")
    assert "twin_prior.2x4.start_weight" in tags and float(tags[WINDOW_END_TAG]) > 1.7e9
    code, res, _ = _cycle(promoted, capsys, "--estimators", "survival")
    assert code == 0 and res["outcome"] == "nothing-to-do"


def test_a_gateway_log_with_no_part_yet_is_nothing_to_do_but_a_missing_one_is_bad_input(
    isolated, capsys
) -> None:
    mlflow.set_tracking_uri(f"sqlite:///{isolated / 'mlflow.db'}")
    log = isolated / "fresh"
    log.mkdir()
    (log / "log.json").write_text(json.dumps({"origin_epoch_s": 1.7e9}))
    code, res, _ = _cycle(log, capsys, "--estimators", "survival")
    assert code == 0 and res["outcome"] == "nothing-to-do" and "no requests yet" in res["why"]
    (log / "log.json").unlink()  # a folder that is not a gateway's log: still an error
    code, _, err = _cycle(log, capsys, "--estimators", "survival")
    assert code == 2 and "holds no trace parts" in err


def test_failed_steps_move_no_alias(promoted, capsys, tmp_path) -> None:
    before = _aliases()
    write_log(promoted, 2400, first=1200)  # new requests: exactmatch beats the champion on them
    code, _, err = _cycle(promoted, capsys, "--estimators", "exactmatch",
                          "--gateway", "http://127.0.0.1:9")  # fmt: skip
    assert code == 4 and "pipeline step 'preflight' failed" in err, err[-2000:]
    assert _aliases() == before

    broken = tmp_path / "broken"
    shutil.copytree(promoted, broken)
    (broken / "part-0000000000000-00000.parquet").write_bytes(b"not parquet")
    code, _, err = _cycle(broken, capsys, "--estimators", "exactmatch")
    assert code == 2 and "pipeline step 'window' failed" in err, err[-2000:]
    assert _aliases() == before


@pytest.mark.server
def test_a_reload_that_fails_after_the_alias_moved_restores_it(promoted, capsys, tmp_path) -> None:
    from tests.serving.service.helpers import Server

    before = _aliases()
    write_log(promoted, 2400, first=1200)
    model = tmp_path / "served.joblib"
    version = MlflowClient().get_model_version_by_alias(MODEL, "champion")
    local = mlflow.artifacts.download_artifacts(f"models:/{MODEL}/{version.version}")
    shutil.copy(next(Path(local).rglob("*.joblib")), model)
    server = Server(str(model), log=tmp_path / "serve.log")
    try:
        model.write_bytes(b"not a model any more")  # its next reload fails (502)
        code, _, err = _cycle(promoted, capsys, "--estimators", "exactmatch",
                              "--service", server.url)  # fmt: skip
    finally:
        server.process.terminate()
    assert code == 4 and "pipeline step 'reload' failed" in err, err[-2000:]
    assert "aliases restored" in err
    assert _aliases() == before


def _prior(means: list[float], ses: list[float]) -> dict:
    return {"start_weight": 0.0, "candidates": [0.0, 0.5, 1.0], "mean_log_ratio": means,
            "se": ses, "upper": [1.0, 1.0, 1.0], "windows": 8, "overlap": 1.0,
            "block_requests": 64, "workers": 2, "slots": 4, "load": None,
            "holdout_requests": 500, "holdout_first_arrival_s": 0.0,
            "holdout_last_arrival_s": 1.0}  # fmt: skip


def test_the_twin_judges_harm_only_when_a_weight_is_resolved_worse() -> None:
    assert not twin_verdict([_prior([0.0, 0.01, 0.02], [0.0, 0.02, 0.02])], 2, 4).harmful
    harmful = twin_verdict([_prior([0.0, 0.01, 0.10], [0.0, 0.02, 0.02])], 2, 4)
    assert harmful.harmful and "w = 1" in harmful.why
    with pytest.raises(Exception, match="2x8"):
        twin_verdict([_prior([0.0, 0.0, 0.0], [0.0, 0.0, 0.0])], 2, 8)


def test_the_loop_survives_a_failed_cycle_and_stops_on_sigterm(tmp_path) -> None:
    calls: list[int] = []

    def cycle(cfg: PipelineConfig) -> CycleResult:
        calls.append(1)
        if len(calls) == 1:
            raise StepFailed("pipeline step 'window' failed: unreadable")
        if len(calls) == 3:
            os.kill(os.getpid(), signal.SIGTERM)  # finishes this cycle, then stops
        return CycleResult(Outcome.NOTHING_TO_DO, "no new requests")

    before = signal.getsignal(signal.SIGTERM)
    cfg = PipelineConfig(log=str(write_log(tmp_path / "log", 100)))
    assert run_loop(cfg, 0.01, cycle=cycle) == 0
    assert len(calls) == 3 and signal.getsignal(signal.SIGTERM) is before

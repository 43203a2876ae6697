"""BR-H through the service: same decisions as in process, and it survives the service dying."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from balanceroute.cli import main as balanceroute_main
from balanceroute.features.synthetic import generate
from balanceroute.predict.remote import RemoteEstimator
from balanceroute.router.lab.runner import ReplaySpec, replay
from balanceroute.router.policies.specs import RouterSpec
from tests.serving.service.helpers import load_model

pytestmark = pytest.mark.server
SIM = [
    "--router",
    "brh",
    "--requests",
    "300",
    "--workers",
    "4",
    "--slots",
    "8",
    "--seed",
    "5",
    "--projection",
    "expected",
]


def _summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_simulate_through_the_service_matches_the_in_process_run(
    start_server, model_dir: Path, tmp_path: Path
) -> None:
    model = str(model_dir / "exactmatch.joblib")
    server = start_server(model)
    remote_out, local_out = tmp_path / "remote", tmp_path / "local"
    remote_args = ["--estimator-url", server.url, "--estimator-timeout", "5"]
    assert balanceroute_main(["simulate", *SIM, *remote_args, "--out", str(remote_out)]) == 0
    local_args = ["--estimator", "exactmatch", "--model-uri", model]
    assert balanceroute_main(["simulate", *SIM, *local_args, "--out", str(local_out)]) == 0
    remote, local = _summary(remote_out), _summary(local_out)
    assert remote["remote_fallbacks"] == 0 and remote["remote_calls"] > 50
    assert remote["remote_errors_by_kind"] == {}
    assert remote["remote_observed"] > 0
    assert remote["config"]["router"]["estimator"] == "remote:exactmatch"
    assert remote["completed_requests"] == local["completed_requests"] == 300
    assert remote["mean_imbalance"] == local["mean_imbalance"]
    assert remote["iterations"] == local["iterations"]


@pytest.mark.slow  # 45-80 s; the fallback on a dead service: test_hardening
def test_killing_the_service_mid_run_falls_back_and_serves_every_request(
    start_server, model_dir: Path
) -> None:
    server = start_server(str(model_dir / "survival.joblib"), via_cli=True)
    frame = generate("paper-prod", 400, seed=11)
    fallback = load_model(model_dir, "survival")
    remote = RemoteEstimator(server.url, fallback=fallback, timeout_s=2.0)
    spec = ReplaySpec(router=RouterSpec.parse("brh:survival"), workers=4, slots=8, seed=1)

    def killer() -> None:
        deadline = time.monotonic() + 60
        while remote.stats()["remote_ok"] < 10 and time.monotonic() < deadline:
            time.sleep(0.005)
        server.stop()

    thread = threading.Thread(target=killer)
    thread.start()
    _, summary = replay(frame, spec, estimator=remote)
    thread.join()
    stats = remote.stats()
    assert summary["completed_requests"] == 400
    assert stats["remote_ok"] >= 10
    assert stats["remote_fallbacks"] > 0
    assert set(stats["remote_errors_by_kind"]) <= {"connect", "transport", "timeout"}
    assert stats["remote_errors_by_kind"]

"""Predictions beside outcomes, live: a real gateway routing with BR-H and a learned estimator in
front of two emulated ranks. Its completion log carries what the model predicted at each
admission, and its ``/metrics`` the live quality gauges of the model's version over a small
window. A request no estimator predicted for (``count-jsq``) has nulls in those columns."""

from __future__ import annotations

import hashlib
import math
import time
from concurrent.futures import ThreadPoolExecutor

import pandas as pd
import pyarrow.parquet as pq
import pytest

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.files import write_parquet
from balanceroute.features.synthetic import generate
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.live_quality import (
    LIVE_QUALITY_METRICS,
    LIVE_WINDOW,
    NO_PREDICTION,
    PREDICTION_COLUMNS,
    WINDOW_ENV,
)
from balanceroute.predict.model_store import save_estimator
from balanceroute.serving.lifecycle.completion_log import CompletionLog
from tests.serving.gateway.helpers import GatewayProcess, completion
from tests.serving.testbed.helpers import Emulator

WINDOW = 50
LENGTHS = (6, 30, 70, 100, 150)  # within H = 80 and beyond: both outcomes
HOLDOUT_BRIER = 0.2


def test_a_request_without_a_prediction_has_typed_null_columns(tmp_path):
    log = CompletionLog(tmp_path, 1 << 20, 10.0)
    for i in range(3):
        log.add(f"r{i}", log.origin + i, 10, 5, "k", 0, "count-jsq", 0.0, log.origin + i + 1,
                "length", NO_PREDICTION)  # fmt: skip
    write_parquet(*log.take())
    table = pq.read_table(next(tmp_path.glob("part-*.parquet")))
    assert all(table[c].null_count == 3 for c in PREDICTION_COLUMNS)
    types = [str(table.schema.field(c).type) for c in PREDICTION_COLUMNS]
    assert types == ["double", "double", "int64", "string", "string"]


@pytest.mark.server
def test_completion_log_and_metrics_carry_the_prediction_at_admission(tmp_path):
    est = build_estimator(EstimatorSpec("survival"), history=generate("azure-conv", 300, seed=1),
                          horizon=DEFAULT_HORIZON)  # fmt: skip
    est.holdout_brier_ = HOLDOUT_BRIER  # as ``train`` saves it
    model = save_estimator(est, tmp_path / "survival.joblib")
    version = hashlib.sha256(model.read_bytes()).hexdigest()[:12]
    emu = Emulator(tmp_path / "emu.log", ranks=2, slots=4, time_scale=50.0)
    gw = None
    try:
        gw = GatewayProcess(tmp_path / "gw.log", emu.urls, "--slots", "4", "--router", "brh",
                            "--estimator", f"survival@{model}", "--out", str(tmp_path / "gw"),
                            env={WINDOW_ENV: str(WINDOW)})  # fmt: skip
        labels = {"model": "survival", "version": version}
        deadline, sent = time.monotonic() + 25.0, 0
        with ThreadPoolExecutor(8) as pool:
            while time.monotonic() < deadline:
                batch = range(sent, sent + 16)
                answers = list(pool.map(lambda i: completion(
                    gw.url, LENGTHS[i % len(LENGTHS)], stream=bool(i % 2),
                    prompt="word " * (1 + (7 * i) % 60), rid=f"q-{i}"), batch))  # fmt: skip
                assert all(a.status_code == 200 for a in answers)
                sent += 16
                if gw.metric(LIVE_WINDOW, **labels) >= WINDOW:
                    break
        values = {name: gw.metric(name, **labels) for name in (*LIVE_QUALITY_METRICS, LIVE_WINDOW)}
        assert values[LIVE_WINDOW] == WINDOW, values  # the window keeps the last WINDOW only
        assert all(math.isfinite(v) for v in values.values()), values
        assert 0.0 <= values["balanceroute_live_brier"] <= 1.0
        assert values["balanceroute_prediction_drift"] == pytest.approx(
            values["balanceroute_live_brier"] / HOLDOUT_BRIER, rel=1e-6
        )
    finally:
        if gw is not None:
            gw.stop()  # writes the completion log
        emu.stop()
    parts = sorted((tmp_path / "gw" / "completions").glob("part-*.parquet"))
    log = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
    assert len(log) == sent and log[list(PREDICTION_COLUMNS)].notna().all().all()
    assert log["predicted_p_finish"].between(0, 1).all()
    assert log["predicted_c"].between(1, DEFAULT_HORIZON).all()
    assert (log["predicted_horizon"] == DEFAULT_HORIZON).all()
    assert (log["model_name"] == "survival").all() and (log["model_version"] == version).all()

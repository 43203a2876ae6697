"""A served ``hazard`` model answers ``/v1/predict`` exactly as in process, curves included,
before and after ``/v1/observe``."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from balanceroute.predict.base import CompletedBatch, RunningBatch
from tests.serving.service.helpers import Server, completion_rows, load_model, post, random_running

pytestmark = pytest.mark.server
SERVER_ARMS = ("hazard", None)


@pytest.fixture(scope="module")
def mirror(model_dir: Path):
    """An in-process copy of the served model, fed the same observations."""
    return load_model(model_dir, "hazard")


def _check(server: Server, est, req: dict, time_s: float) -> None:
    body = {"requests": req["rows"], "survival": True, "time_s": time_s}
    with server.client() as c:
        resp = post(c, "/v1/predict", body)
    assert resp.status_code == 200, resp.text
    got = orjson.loads(resp.content)
    want = est.predict(
        RunningBatch(req["prompt"], req["age"], req["keys"], time_s=time_s), survival=True
    )
    assert got["model"]["kind"] == "hazard"
    assert np.array_equal(np.array(got["p_finish"]), want.p_finish)
    assert np.array_equal(np.array(got["c"]), want.c)
    curves = np.array(got["survival"])
    assert np.array_equal(curves, want.survival)
    assert (np.diff(curves, axis=1) <= 0).all()


def test_hazard_is_served_like_in_process(
    module_server: Server, mirror, history, key_pool: np.ndarray
) -> None:
    rng = np.random.default_rng(17)
    _check(module_server, mirror, random_running(rng, 200, key_pool), 4321.0)
    done = completion_rows(history, key_pool, 150)
    tail, keys, times, rows = done["tail"], done["keys"], done["times"], done["rows"]
    with module_server.client() as c:
        assert post(c, "/v1/observe", {"completions": rows}).status_code == 200
    mirror.observe(
        CompletedBatch(
            tail["prompt_tokens"].to_numpy(), tail["output_tokens"].to_numpy(), keys, times
        )
    )
    _check(module_server, mirror, random_running(rng, 64, key_pool), 5101.0)

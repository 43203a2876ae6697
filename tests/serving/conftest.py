"""Fixtures of the service tests: small fitted models on disk and real servers on loopback."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.schema import hash_keys
from balanceroute.features.synthetic import generate
from balanceroute.predict.model_store import save_estimator
from balanceroute.predict.registry import make_estimator
from tests.serving.service.helpers import Server

SMALL_PARAMS = {
    "survival": {},
    "exactmatch": {},
    "gbdt": {"n_estimators": 20, "per_request": 4},
    "hazard": {"n_estimators": 20, "per_request": 4, "bins": 8, "min_data_in_leaf": 50},
}


@pytest.fixture(scope="session")
def history() -> pd.DataFrame:
    """A small synthetic trace with recurring prompt templates."""
    return generate("paper-prod", 1200, seed=3)


@pytest.fixture(scope="session")
def key_pool(history: pd.DataFrame) -> np.ndarray:
    """Hashed prompt keys of the trace (so per-key statistics are hit), plus an unseen one."""
    keys = np.unique(hash_keys(history["prompt_key"]))[:50]
    return np.concatenate((keys, np.array([12345], dtype=np.uint64)))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory, history: pd.DataFrame) -> Path:
    """``survival``, ``exactmatch``, ``gbdt`` and ``hazard`` fitted on the trace, saved as
    joblib files."""
    out = tmp_path_factory.mktemp("models")
    for kind, params in SMALL_PARAMS.items():
        save_estimator(make_estimator(kind, **params).fit(history), out / f"{kind}.joblib")
    return out


@pytest.fixture
def start_server(tmp_path: Path) -> Iterator:
    """Start servers for one test; every one is killed when the test ends."""
    started: list[Server] = []

    def start(model_uri: str, model_uri_b: str | None = None, **kwargs) -> Server:
        log = tmp_path / f"server-{len(started)}.log"
        server = Server(model_uri, model_uri_b, log=log, **kwargs)
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(scope="module")
def module_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, model_dir: Path
) -> Iterator[Server]:
    """One server per test module; the module sets ``SERVER_ARMS`` (kinds of arms a and b)."""
    a, b = getattr(request.module, "SERVER_ARMS", ("survival", "exactmatch"))
    env = getattr(request.module, "SERVER_ENV", None)
    log = tmp_path_factory.mktemp("server") / "server.log"
    server = Server(
        str(model_dir / f"{a}.joblib"),
        str(model_dir / f"{b}.joblib") if b else None,
        env=env,
        log=log,
    )
    yield server
    server.stop()

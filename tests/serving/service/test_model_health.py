"""The model store's health: an update that raises or a model that answers nonsense makes the
arm unhealthy (``/readyz`` fails), what broke it never enters the replay log, and a reload
heals it; chunked observes keep the finish order."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from balanceroute.predict.base import Prediction
from balanceroute.predict.health import health_problem
from balanceroute.serving.service.decode import CompletedColumns
from balanceroute.serving.service.models import ModelSlots
from tests.serving.service.helpers import load_model


def cols(outputs: list[int]) -> CompletedColumns:
    n = len(outputs)
    return CompletedColumns(
        np.full(n, 100, dtype=np.int64),
        np.asarray(outputs, dtype=np.int64),
        np.zeros(n, dtype=np.uint64),
        None,
    )


def test_a_broken_update_is_not_replayed_and_reload_heals(model_dir: Path) -> None:
    async def scenario() -> None:
        store = ModelSlots({"a": str(model_dir / "survival.joblib")}, inline_rows=100)
        await store.reload(force=True)
        assert store.ready
        await store.observe(cols([10, 20, 30, 40]))
        assert store.log.total == 4
        est = store.slots["a"].estimator
        real = est.observe

        def boom(batch):
            if (batch.output_tokens == 777).any():
                raise MemoryError("simulated")
            real(batch)

        est.observe = boom
        await store.observe(cols([50, 777, 60]))
        assert not store.ready and "MemoryError" in store.not_ready_reason("a")
        assert store.log.total == 4  # the batch that broke it is not kept for replays
        await store.observe(cols([5]))  # an unhealthy arm is not fed any more
        outcome = await store.reload(force=True)
        assert outcome[0].changed and store.ready
        assert 777 not in store.log.batch().output_tokens

    asyncio.run(scenario())


def test_a_reloaded_model_has_learned_the_recent_completions(model_dir: Path) -> None:
    from tests.serving.lifecycle.test_renew import UNSEEN_KEY, c_of_the_key

    async def scenario() -> None:
        store = ModelSlots({"a": str(model_dir / "exactmatch.joblib")})
        await store.reload(force=True)
        as_loaded = c_of_the_key(store.slots["a"].estimator)
        n = 300
        await store.observe(
            CompletedColumns(
                np.full(n, 100, dtype=np.int64),
                np.full(n, 1500, dtype=np.int64),
                np.full(n, UNSEEN_KEY, dtype=np.uint64),
                None,
            )
        )
        learned = c_of_the_key(store.slots["a"].estimator)
        [outcome] = await store.reload(force=True)
        assert outcome.changed
        replayed = c_of_the_key(store.slots["a"].estimator)
        assert not np.allclose(replayed, as_loaded)
        np.testing.assert_allclose(replayed, learned)  # the replay taught it what the old one knew

    asyncio.run(scenario())


@pytest.mark.parametrize("kind", ["exactmatch", "gbdt", "hazard"])
def test_an_observe_off_the_loop_equals_one_in_place(model_dir: Path, kind: str) -> None:
    rng = np.random.default_rng(0)
    outputs = rng.integers(1, 3000, 1000).tolist()

    async def fed(inline: int):
        store = ModelSlots({"a": str(model_dir / f"{kind}.joblib")}, inline_rows=inline)
        await store.reload(force=True)
        await store.observe(cols(outputs))
        return store.slots["a"].estimator

    whole, chunked = asyncio.run(fed(10_000)), asyncio.run(fed(10))
    from balanceroute.predict.health import canary_batch

    a = whole.predict(canary_batch(), survival=True)
    b = chunked.predict(canary_batch(), survival=True)
    np.testing.assert_array_equal(a.p_finish, b.p_finish)
    np.testing.assert_array_equal(a.survival, b.survival)


@pytest.mark.parametrize("bad", ["nan", "range", "raises"])
def test_health_check_catches_nonsense(model_dir: Path, bad: str) -> None:
    est = load_model(model_dir, "survival")
    assert health_problem(est) is None

    def predict(batch, *, survival=False):
        n = batch.size
        if bad == "raises":
            raise ValueError("boom")
        value = np.nan if bad == "nan" else 2.0
        return Prediction(np.full(n, value), np.full(n, 1.0), None)

    est.predict = predict
    assert health_problem(est) is not None


def test_readyz_fails_for_an_unhealthy_model(model_dir: Path) -> None:
    async def scenario() -> None:
        store = ModelSlots({"a": str(model_dir / "survival.joblib")})
        await store.reload(force=True)
        assert store.check_health(0.0) == {}
        store.slots["a"].estimator.predict = lambda batch, survival=False: Prediction(
            np.full(batch.size, np.nan), np.ones(batch.size)
        )
        assert "a" in store.check_health(0.0) and not store.ready

    asyncio.run(scenario())

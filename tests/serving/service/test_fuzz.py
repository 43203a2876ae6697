"""API fuzzing against a real server: schemathesis over the OpenAPI document (no input answers
500), and hypothesis stateful sequences of observe, predict and reload with extreme numbers
(the model stays healthy and its answers in range). Example counts are bounded."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule, run_state_machine_as_test
from schemathesis.checks import not_a_server_error

from balanceroute.features.limits import input_limits
from tests.serving.service.helpers import Server, post

pytestmark = pytest.mark.server
LIMITS = input_limits()


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory, model_dir: Path):
    log = tmp_path_factory.mktemp("fuzz") / "server.log"
    s = Server(str(model_dir / "exactmatch.joblib"), str(model_dir / "gbdt.joblib"), log=log)
    yield s
    s.stop()


def test_no_input_answers_500(fuzz_server: Server) -> None:
    """Every operation of the OpenAPI document, with bodies schemathesis generates from it
    (valid and invalid, extreme numbers included): never a 5xx."""
    api = schemathesis.openapi.from_url(fuzz_server.url + "/openapi.json")
    operations = [result.ok() for result in api.get_all_operations()]
    assert len(operations) >= 7
    calls: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
        def call(case) -> None:
            case.call_and_validate(base_url=fuzz_server.url, checks=[not_a_server_error])
            calls.append(case.method)

        call()
    assert len(calls) >= 5 * len(operations)


TOKENS = st.one_of(
    st.integers(1, 4000),
    st.sampled_from([1, LIMITS.max_output_tokens - 1, LIMITS.max_output_tokens]),
)
PROMPTS = st.one_of(st.integers(1, 8000), st.just(LIMITS.max_prompt_tokens))
AGES = st.one_of(st.integers(0, 3000), st.just(LIMITS.max_output_tokens))
KEYS = st.one_of(st.none(), st.sampled_from(["t1", "t2", "t3"]), st.integers(0, 2**64 - 1))


def test_observe_predict_reload_sequences(fuzz_server: Server) -> None:
    class Sequences(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.client = httpx.Client(base_url=fuzz_server.url, timeout=30, trust_env=False)

        def teardown(self) -> None:
            self.client.close()

        @rule(rows=st.lists(st.tuples(PROMPTS, TOKENS, KEYS), min_size=1, max_size=300))
        def observe(self, rows) -> None:
            body = {
                "completions": [
                    {"prompt_tokens": p, "output_tokens": o, "prompt_key": k} for p, o, k in rows
                ]
            }
            assert post(self.client, "/v1/observe", body).status_code == 200

        @rule(
            rows=st.lists(st.tuples(PROMPTS, AGES, KEYS), min_size=1, max_size=50),
            arm=st.sampled_from(["a", "b"]),
            survival=st.booleans(),
        )
        def predict(self, rows, arm, survival) -> None:
            body = {
                "requests": [
                    {"id": i, "prompt_tokens": p, "age": a, "prompt_key": k}
                    for i, (p, a, k) in enumerate(rows)
                ],
                "model": arm,
                "survival": survival,
            }
            r = post(self.client, "/v1/predict", body)
            assert r.status_code == 200, r.text
            out = r.json()
            p, c = np.asarray(out["p_finish"]), np.asarray(out["c"])
            assert np.isfinite(p).all() and (p >= 0).all() and (p <= 1).all()
            assert np.isfinite(c).all() and (c >= 0).all() and (c <= out["horizon"]).all()

        @rule(arm=st.sampled_from(["a", "b"]))
        def reload(self, arm) -> None:
            r = post(self.client, "/v1/admin/reload", {"arm": arm, "force": True})
            assert r.status_code == 200 and r.json()["arms"][0]["error"] is None

        @invariant()
        def ready(self) -> None:
            assert self.client.get("/readyz").status_code == 200

    run_state_machine_as_test(
        Sequences,
        settings=settings(
            max_examples=8,
            stateful_step_count=6,
            deadline=None,
            suppress_health_check=list(HealthCheck),
        ),
    )

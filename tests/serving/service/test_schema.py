"""Schemathesis against the service's own OpenAPI document: no input gets a 5xx."""

from __future__ import annotations

import time

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from tests.serving.service.helpers import Server

pytestmark = pytest.mark.server
SERVER_ARMS = ("survival", "exactmatch")
EXAMPLES = 30


@pytest.mark.slow  # 30-50 s of generated requests; test_fuzz.py keeps a shorter search
def test_no_generated_request_gets_a_server_error(module_server: Server) -> None:
    schema = schemathesis.openapi.from_url(f"{module_server.url}/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert {op.label for op in operations} >= {
        "POST /v1/predict",
        "POST /v1/observe",
        "POST /v1/route",
        "GET /v1/models",
        "POST /v1/admin/reload",
        "GET /healthz",
        "GET /readyz",
        "GET /metrics",
    }
    session = requests.Session()
    seen: dict[str, set[int]] = {}
    started = time.monotonic()
    for op in operations:
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=op.as_strategy(generation_mode=mode))
            @settings(
                max_examples=EXAMPLES,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )
            def check(case: schemathesis.Case) -> None:
                response = case.call(base_url=module_server.url, session=session, timeout=30)
                seen.setdefault(case.operation.label, set()).add(response.status_code)
                case.validate_response(response, checks=[not_a_server_error])

            try:
                check()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to break in a bodiless GET
    assert time.monotonic() - started < 90
    assert 200 in seen["POST /v1/predict"] and 422 in seen["POST /v1/predict"]
    assert 200 in seen["POST /v1/route"]

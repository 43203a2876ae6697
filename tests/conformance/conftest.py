"""The conformance suite runs only against a real engine (scripts/conformance.sh sets it up).

Every test here carries the ``conformance`` marker, which the default run (scripts/test.sh)
deselects; without CONFORMANCE_RANKS the tests skip, so a plain ``pytest`` never fails here.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.engine import Engine, engine_from_env
from tests.conformance.processes import Gateway

HERE = Path(__file__).parent


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``conformance``; the checks that stop a rank run last."""
    mine = [i for i in items if HERE in Path(str(i.fspath)).parents]
    for item in mine:
        item.add_marker(pytest.mark.conformance)
    last = [i for i in mine if i.get_closest_marker("stops_rank")]
    for item in last:
        items.remove(item)
        items.append(item)


@pytest.fixture(scope="session")
def engine() -> Engine:
    """The real engine under test; skips when none is configured."""
    found = engine_from_env()
    if found is None:
        pytest.skip("no real engine: run scripts/conformance.sh (or set CONFORMANCE_RANKS)")
    return found


@pytest.fixture
def start_gateway(tmp_path: Path) -> Iterator:
    """Start gateways for one test; every one is stopped when the test ends."""
    started: list[Gateway] = []

    def start(ranks: list[str], *args: str, **kw) -> Gateway:
        gw = Gateway(tmp_path, ranks, *args, **kw)
        started.append(gw)
        return gw

    yield start
    for gw in started:
        gw.stop()


@pytest.fixture(scope="session")
def gateway(engine: Engine, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Gateway]:
    """One gateway in front of the engine's independent ranks (URL mode), shared by the checks
    that need no settings of their own."""
    gw = Gateway(tmp_path_factory.mktemp("gateway"), engine.ranks)
    yield gw
    gw.stop()

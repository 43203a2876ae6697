"""The router's state builds the per-worker loads only when a policy reads them (a live group
ages every running request for them): the first-come policies that count requests decide
without them, and decide alike whatever the loads are."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.router.policies.baselines import FCFSPolicy
from balanceroute.router.policies.policy import RunContext
from balanceroute.router.policies.registry import POLICIES, policy_class
from balanceroute.router.policies.state import ArrayPool, RequestTable, RouterState

G, N = 4, 6
FIRST_COME = sorted(n for n, c in POLICIES.items() if issubclass(c, FCFSPolicy))


def state(loads_source) -> tuple[RouterState, RequestTable]:
    table = RequestTable(
        prompt_tokens=np.array([100, 2000, 40, 900, 5, 300], dtype=np.int64),
        prompt_key=np.zeros(N, dtype=np.uint64),
        trace_index=np.arange(N),
    )
    return RouterState(
        iteration=3,
        time_s=1.0,
        free_slots=np.array([2, 0, 1, 3], dtype=np.int64),
        active=np.array([1, 3, 2, 0], dtype=np.int64),
        pool=ArrayPool(np.arange(N)),
        requests=table,
        running_source=lambda: pytest.fail("no running requests were asked for"),
        loads_source=loads_source,
    ), table


def route(name: str, loads_source) -> list[tuple[int, int]]:
    s, table = state(loads_source)
    policy = policy_class(name)()
    policy.reset(RunContext(G, 3, table, seed=7))
    adm = policy.route(s)
    return list(zip(adm.positions.tolist(), adm.workers.tolist(), strict=True))


def unread() -> np.ndarray:
    raise AssertionError("the loads were read")


@pytest.mark.parametrize("name", FIRST_COME)
def test_first_come_policies_read_the_loads_only_when_they_say_so(name: str) -> None:
    light = route(name, lambda: np.array([0.0, 0.0, 0.0, 0.0]))
    heavy = route(name, lambda: np.array([9e5, 1.0, 5e4, 7.0]))
    if policy_class(name).needs_loads:
        assert light != heavy  # token-jsq places by load: different loads, different ranks
        with pytest.raises(AssertionError, match="read"):
            route(name, unread)
    else:
        assert route(name, unread) == light == heavy


def test_the_loads_are_built_once_and_only_when_read() -> None:
    calls = []
    s, _ = state(lambda: calls.append(1) or np.arange(G, dtype=float))
    assert calls == [] and s.workers == G
    assert s.loads.tolist() == [0.0, 1.0, 2.0, 3.0] and s.loads is s.loads
    assert calls == [1]

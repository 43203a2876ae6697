"""Prefill alignment (``prefill_align``): admissions held until every rank has a free slot, at
most that many iterations, checked by hand and as properties of the simulator's outcome."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from balanceroute.features.errors import UserError
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.router.policies.registry import policy_class
from tests.router.helpers import occupancy, released

PREFILL = CostModel(t_fixed_s=1.0, t_token_s=0.01, t_prefill_s=0.1, prefill_chunk_tokens=4)


def _run(wait: int, outputs: list[int], prompts: list[int] | None = None):
    prompts = prompts or [4] * len(outputs)
    policy = policy_class("br0")(prefill_align=wait)
    return simulate(released(prompts, outputs), policy, SimConfig(workers=2, slots=1, cost=PREFILL))


@pytest.mark.parametrize("wait", [0, 3, 16])
def test_the_freed_slot_waits_for_the_other_rank_at_most_wait_iterations(wait):
    # one slot per rank: the two requests admitted first leave at e1 < e2; the next two are
    # admitted as each slot frees (wait 0), together at e2 (e2 - e1 < wait), or each `wait`
    # after its slot freed (the other rank is busy both times)
    res = _run(wait, [10, 17, 30, 44])
    first = np.flatnonzero(res.admit_iter == 0)
    assert first.size == 2
    e1, e2 = np.sort(res.admit_iter[first] + res.output_tokens[first])
    rest = np.sort(res.admit_iter[res.admit_iter > 0])
    if wait == 0:
        expected = [e1, e2]
    elif e2 - e1 < wait:
        expected = [e2, e2]
    else:
        expected = [e1 + wait, e2 + wait]
    np.testing.assert_array_equal(rest, expected)


def test_aligned_prompts_share_prefill_steps():
    # prompts of 8 (two chunks): admitted together, the two ranks compute them in the same two
    # steps; admitted apart, in four
    res_apart = _run(0, [10, 17, 30, 44], [4, 4, 8, 8])
    res_aligned = _run(16, [10, 17, 30, 44], [4, 4, 8, 8])
    late = res_aligned.admit_iter > 0
    assert len(set(res_aligned.admit_iter[late].tolist())) == 1
    assert len(set(res_apart.admit_iter[res_apart.admit_iter > 0].tolist())) == 2
    np.testing.assert_array_equal(res_aligned.prefill_steps[late], [1, 1])


def test_a_negative_wait_is_refused_by_name():
    with pytest.raises(UserError, match="prefill_align"):
        policy_class("brh")(prefill_align=-1)


@st.composite
def workloads(draw):
    n = draw(st.integers(1, 40))
    prompts = draw(st.lists(st.integers(1, 3000), min_size=n, max_size=n))
    outputs = draw(st.lists(st.integers(1, 40), min_size=n, max_size=n))
    arrivals = np.cumsum(draw(st.lists(st.floats(0, 3), min_size=n, max_size=n)))
    return prompts, outputs, arrivals, draw(st.booleans()), draw(st.integers(1, 4)), \
        draw(st.integers(1, 4)), draw(st.integers(0, 8))  # fmt: skip


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=workloads(), name=st.sampled_from(["br0", "brh"]))
def test_holds_are_bounded_and_nothing_is_lost(data, name):
    prompts, outputs, arrivals, saturate, g, b, wait = data
    policy = policy_class(name)(prefill_align=wait, horizon=0 if name == "br0" else 6)
    rq = released(prompts, outputs, arrivals=arrivals, saturate=saturate)
    res = simulate(rq, policy, SimConfig(workers=g, slots=b))  # occupancy() counts no prefill
    assert np.array_equal(np.sort(res.trace_index), np.arange(len(prompts)))
    assert (res.admit_iter >= 0).all()
    occ = occupancy(res)
    assert occ.max() <= b
    # requests wait beside a free slot only while some rank is full, and for at most `wait`
    # iterations in a row
    short = (res.waiting > 0) & (occ.sum(axis=1) < g * b)
    assert np.all((occ[short] == b).any(axis=1))
    run = longest = 0
    for held in short.tolist():
        run = run + 1 if held else 0
        longest = max(longest, run)
    assert longest <= wait

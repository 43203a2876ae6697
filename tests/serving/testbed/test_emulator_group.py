"""The decode group alone (asyncio, no HTTP): barrier loads by hand, FCFS queues, cancellation."""

from __future__ import annotations

import asyncio

import numpy as np

from balanceroute.router.lab.cost import CostModel
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.group import DecodeGroup, EmuRequest

COST = CostModel(t_fixed_s=0.002, t_token_s=1e-6)


def _config(**kw) -> EmulatorConfig:
    return EmulatorConfig(**{"ranks": 2, "slots": 2, "cost": COST, **kw})


async def _run(group: DecodeGroup, reqs: list[EmuRequest], during=None) -> None:
    clock = asyncio.get_running_loop().create_task(group.run())
    for r in reqs:
        group.submit(r)
    if during is not None:
        await during()
    while not all(r.closed for r in reqs):
        await asyncio.sleep(0.005)
    clock.cancel()


def _req(group: DecodeGroup, rank: int, prompt: int, out: int) -> EmuRequest:
    r = group.new_request(
        rank, prompt_tokens=prompt, max_tokens=out, ignore_eos=True, stream=True, endpoint="x"
    )
    group.release(r)  # no HTTP handler holds it
    return r


def test_loads_tokens_and_fcfs_by_hand():
    group = DecodeGroup(_config())
    # rank 0 (two slots): a(10, 3) b(5, 1) c(7, 2) d(1, 2) e(2, 1); rank 1: f(4, 2)
    spec = [(0, 10, 3), (0, 5, 1), (0, 7, 2), (0, 1, 2), (0, 2, 1), (1, 4, 2)]
    reqs = [_req(group, *s) for s in spec]
    asyncio.run(_run(group, reqs))
    log = group.log
    loads = log.per_rank["loads"][: log.j]
    np.testing.assert_array_equal(loads, [[15, 4], [18, 5], [20, 0], [3, 0], [2, 0]])
    np.testing.assert_array_equal(log.cols["emitted"][: log.j], [3, 3, 2, 2, 1])
    assert [r.admit_iter for r in reqs] == [0, 0, 1, 3, 3, 0]
    assert [r.generated for r in reqs] == [3, 1, 2, 2, 1, 2]
    dur = log.cols["duration_s"][: log.j]
    np.testing.assert_array_equal(dur, COST.t_fixed_s + COST.t_token_s * loads.max(axis=1))
    start = log.cols["model_start_s"][: log.j]
    np.testing.assert_array_equal(start[1:], start[:-1] + dur[:-1])
    assert (log.per_rank["running"][: log.j] <= 2).all()
    m = group.rank_states[0].metrics
    assert m.generation_tokens == 9 and m.prompt_tokens == 25 and m.success["length"] == 5


def test_cancelled_request_leaves_at_the_next_iteration_with_its_tokens():
    group = DecodeGroup(_config(slots=1, time_scale=0.5))  # one slot, 4 ms iterations
    long = _req(group, 0, 3, 10_000)
    queued = [_req(group, 0, 1, 2) for _ in range(2)]

    async def cancel_soon() -> None:
        while long.generated < 3:
            await asyncio.sleep(0.001)
        group.cancel(long)

    asyncio.run(_run(group, [long, *queued], during=cancel_soon))
    assert long.state != 2 and 3 <= long.generated < 10  # cancelled, kept its tokens
    k_leave = long.admit_iter + long.generated
    assert queued[0].admit_iter == k_leave and queued[1].admit_iter == k_leave + 2
    assert group.rank_states[0].metrics.success["abort"] == 1

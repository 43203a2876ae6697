"""The emulated group's colocated prefill term by hand: chunks stall the group, first tokens wait."""

from __future__ import annotations

import asyncio

import numpy as np

from balanceroute.features.schema import to_arrays
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.prefill import PrefillConfig, release
from balanceroute.router.lab.scripted import ScriptedPolicy
from balanceroute.router.lab.simulator import SimConfig, simulate
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.group import DecodeGroup
from balanceroute.serving.testbed.emulator.iterlog import IterationLog, read_log
from tests.router.helpers import frame
from tests.serving.testbed.test_emulator_group import _req, _run

# The simulator's hand case in seconds / 1000: t_fixed 1 ms, 10 us a KV token, 100 us a prompt
# token, chunks of 4.
COST = CostModel(t_fixed_s=1e-3, t_token_s=1e-5, t_prefill_s=1e-4, prefill_chunk_tokens=4)


def _group(cost: CostModel) -> DecodeGroup:
    return DecodeGroup(EmulatorConfig(ranks=2, slots=2, cost=cost))


def test_prefill_chunks_stall_the_group_and_delay_the_first_token_by_hand():
    # r0 (S=10, O=2) on rank 0, r1 (S=4, O=1) on rank 1. Rank 0 computes 4, 4, 2 prompt
    # tokens in k0..k2 and emits r0's first token at the end of k2; rank 1 its 4 in k0.
    group = _group(COST)
    r0, r1 = _req(group, 0, 10, 2), _req(group, 1, 4, 1)
    asyncio.run(_run(group, [r0, r1]))
    log = group.log
    j = log.j
    np.testing.assert_array_equal(log.per_rank["prefill"][:j], [[4, 4], [4, 0], [2, 0], [0, 0]])
    np.testing.assert_array_equal(log.per_rank["loads"][:j], [[10, 4], [10, 0], [10, 0], [11, 0]])
    np.testing.assert_allclose(log.cols["duration_s"][:j], [1.5e-3, 1.5e-3, 1.3e-3, 1.11e-3])
    np.testing.assert_array_equal(log.cols["emitted"][:j], [1, 0, 1, 1])
    ends = log.cols["end_s"][:j] + group.t0
    assert r0.first_token_s == ends[2] and r1.first_token_s == ends[0]
    assert r0.generated == 2 and r1.generated == 1
    assert group.rank_states[0].metrics.ttft.count == 1


def test_the_emulator_and_the_simulator_agree_on_a_prefilling_run():
    rng = np.random.default_rng(11)
    n = 24
    prompts, outputs = rng.integers(1, 40, n), rng.integers(1, 12, n)
    ranks = rng.integers(0, 2, n)
    group = _group(COST)
    spec = zip(ranks, prompts, outputs, strict=True)
    reqs = [_req(group, int(g), int(p), int(o)) for g, p, o in spec]
    asyncio.run(_run(group, reqs))
    log = group.log
    rq = release(to_arrays(frame(prompts, outputs)), PrefillConfig(saturate=True))
    script = ScriptedPolicy(np.array([r.admit_iter for r in reqs]), ranks)
    res = simulate(rq, script, SimConfig(workers=2, slots=2, cost=COST))
    np.testing.assert_array_equal(res.loads, log.per_rank["loads"][: log.j])
    np.testing.assert_allclose(np.diff(res.t_start), log.cols["duration_s"][: log.j])


def test_a_group_with_a_log_folder_writes_what_it_ran_when_it_goes_idle(tmp_path):
    config = EmulatorConfig(ranks=2, slots=2, cost=COST)
    group = DecodeGroup(config, log=IterationLog(tmp_path, config.ranks))

    async def run_then_idle() -> None:
        reqs = [_req(group, 0, 10, 2), _req(group, 1, 4, 1)]
        await _run(group, reqs)
        task = asyncio.get_running_loop().create_task(group.run())  # goes idle at once
        for _ in range(200):
            await asyncio.sleep(0.005)
            if list((tmp_path / "iterations").glob("part-*.parquet")):
                break
        task.cancel()

    asyncio.run(run_then_idle())
    iterations, _ = read_log(tmp_path)  # no flush() called: the idle group wrote them
    assert iterations["iteration"].tolist() == [0, 1, 2, 3]
    assert [list(p) for p in iterations["prefill"]] == [[4, 4], [4, 0], [2, 0], [0, 0]]


def test_a_taken_log_part_does_not_change_as_the_next_rows_fill_the_buffers(tmp_path):
    # the part is written in a thread while the group logs on into the same buffers
    log = IterationLog(tmp_path, 2)
    log.cols["iteration"][:2] = [0, 1]
    log.per_rank["loads"][:2] = [[10, 4], [11, 5]]
    log.j = 2
    table = log.take()
    log.cols["iteration"][0] = 2
    log.per_rank["loads"][0] = [99, 99]
    assert table.column("iteration").to_pylist() == [0, 1]
    assert table.column("loads").to_pylist() == [[10, 4], [11, 5]]

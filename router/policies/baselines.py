"""FCFS baselines: admit the head of the pool, pick each destination by a simple rule.

These are the comparison policies of the paper (Table 2) plus ``token-jsq``, what SGLang's
``minimum_tokens`` and vLLM's token-level data-parallel balancing do. Counts, loads and free
slots are updated after every assignment within a step. The per-assignment loops run on plain
lists and heaps: a step admits a handful of requests, where numpy calls cost more than they save.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import ClassVar

import numpy as np

from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.state import Admissions, RouterState


class FCFSPolicy(Policy):
    """Global first-come-first-served admission; ``assign`` picks the destinations in order.

    ``assign`` gets plain lists (free slots, active counts, loads and the admitted prompts, or
    None where the policy does not need them) and returns one worker per admitted request,
    updating its lists as it goes.
    """

    needs_prompts: ClassVar[bool] = False
    needs_loads: ClassVar[bool] = False  # a live group ages every running request for them

    def route(self, state: RouterState) -> Admissions:
        due = state.admissions_due
        if due == 0:
            return Admissions.empty()
        positions = state.pool.head(due)
        prompts = state.requests.prompt_tokens[positions].tolist() if self.needs_prompts else None
        loads = state.loads.tolist() if self.needs_loads else None
        workers = self.assign(due, state.free_slots.tolist(), state.active.tolist(), loads, prompts)
        return Admissions(positions, np.fromiter(workers, dtype=np.int64, count=len(workers)))

    def assign(
        self,
        count: int,
        free: list[int],
        active: list[int],
        loads: list[float] | None,
        prompts: list[int] | None,
    ) -> list[int]:
        raise NotImplementedError  # pragma: no cover - interface


def smallest_key_assign(
    count: int, keys: list, free: list[int], bump: Callable[[object, int], object]
) -> list[int]:
    """Assign requests one by one to the open worker with the smallest ``(key, index)``."""
    heap = [(keys[g], g) for g in range(len(free)) if free[g] > 0]
    heapq.heapify(heap)
    out = []
    for j in range(count):
        key, g = heap[0]
        out.append(g)
        free[g] -= 1
        if free[g] > 0:
            heapq.heapreplace(heap, (bump(key, j), g))
        else:
            heapq.heappop(heap)
    return out


def sampled_assign(
    count: int, free: list[int], active: list[int], draws: list[list[float]]
) -> list[int]:
    """Each request samples open workers uniformly (one draw per sample, in ``[0, 1)``) and
    joins the sampled worker with the fewest active requests (the first sampled on ties)."""
    open_ = [g for g in range(len(free)) if free[g] > 0]
    out = []
    for row in draws:
        picks = [open_[int(u * len(open_))] for u in row]
        g = min(picks, key=active.__getitem__)
        out.append(g)
        active[g] += 1
        free[g] -= 1
        if free[g] == 0:
            open_.remove(g)
    return out


class SampledPolicy(FCFSPolicy):
    """Each request samples ``samples`` open workers uniformly (seeded) and joins the sampled
    one with the fewest active requests (:func:`sampled_assign`)."""

    samples: ClassVar[int] = 1

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.rng = np.random.default_rng(ctx.seed)

    def assign(self, count, free, active, loads, prompts) -> list[int]:
        draws = self.rng.random((count, self.samples)).tolist()
        return sampled_assign(count, free, active, draws)


class RandomPolicy(SampledPolicy):
    """Uniform among workers with a free slot."""

    name = "random"
    samples = 1


class RoundRobinPolicy(FCFSPolicy):
    """Cyclic pointer; skip full workers; advance past each assignment."""

    name = "round-robin"

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.pointer = 0

    def assign(self, count, free, active, loads, prompts) -> list[int]:
        out = []
        g_count = len(free)
        g = self.pointer % g_count
        for _ in range(count):
            while free[g] == 0:
                g = (g + 1) % g_count
            out.append(g)
            free[g] -= 1
            g = (g + 1) % g_count
        self.pointer = g
        return out


class PowerOfTwoPolicy(SampledPolicy):
    """Two uniform samples (with replacement) among open workers; the one with fewer requests."""

    name = "p2c"
    samples = 2


class CountJSQPolicy(FCFSPolicy):
    """Fewest active requests (the vllm-ascend default); ties to the lowest index."""

    name = "count-jsq"

    def assign(self, count, free, active, loads, prompts) -> list[int]:
        return smallest_key_assign(count, active, free, lambda key, j: key + 1)


class TokenJSQPolicy(FCFSPolicy):
    """Smallest current KV load, counting this step's admissions; ties to the lowest index."""

    name = "token-jsq"
    needs_prompts = True
    needs_loads = True

    def assign(self, count, free, active, loads, prompts) -> list[int]:
        return smallest_key_assign(count, loads, free, lambda key, j: key + prompts[j])

"""The invariants every routing decision must keep, checked the same way everywhere.

A decision admits pool members only, each once, never more to a worker than its free slots,
and, for a maximal policy, exactly ``min(|pool|, free slots)`` requests. The simulator checks
every decision of a replay with :func:`admission_violation`; the routing service checks the one
decision of a call with it too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def admission_violation(
    positions: Sequence[int],
    workers: Sequence[int],
    *,
    due: int,
    free: Sequence[int],
    maximal: bool,
    waiting: Callable[[int], bool],
) -> str | None:
    """What is wrong with admitting ``positions[j]`` to ``workers[j]``, or None if nothing is.

    ``waiting(p)`` says whether position ``p`` is in the pool (not yet admitted).
    """
    if len(positions) != len(workers):
        return "positions and workers differ in length"
    if len(positions) != due and (maximal or len(positions) > due):
        return f"admitted {len(positions)} requests but {due} were due (min(pool, free slots))"
    seen: set[int] = set()
    taken = [0] * len(free)
    for p, g in zip(positions, workers, strict=True):
        if p in seen:
            return f"admitted request {p} twice"
        if not waiting(p):
            return f"admitted request {p}, which is not in the pool"
        seen.add(p)
        if not 0 <= g < len(free):
            return f"worker index {g} outside 0..{len(free) - 1}"
        taken[g] += 1
        if taken[g] > free[g]:
            return f"worker {g} given more than its {free[g]} free slots"
    return None

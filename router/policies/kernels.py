"""Compiled inner loop of a BalanceRoute step (numba).

The router runs inside every decode iteration, and a step makes a few admissions each needing
a handful of tiny ``(H+1)``-vector operations: interpreted numpy spends microseconds per call on
dispatch alone, so the whole step (fairness cap, stage 1, stage 2 with the exact subset search) is one
compiled function. ``router.balance_route`` documents the algorithm; ``tests/router`` checks
this kernel against a plain-Python reference implementation of the same rules.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from balanceroute.predict.incremental import conditioned_loads
from balanceroute.predict.projection import LoadProjection

# indices into the stats counter array
FAIRNESS, STAGE1, STAGE2, FALLBACK = 0, 1, 2, 3


@njit(cache=True, nogil=True)
def _score(b, g, loads, top, weights, total_w, beta, penalty_max):
    """F^H of adding load ``b`` to worker ``g`` (margins ``top - loads[g]``)."""
    pen = 0.0
    if penalty_max:
        worst = 0.0
        for h in range(loads.shape[1]):
            o = b - (top[h] - loads[g, h])
            if o > worst:
                worst = o
        pen = worst * total_w
    else:
        for h in range(loads.shape[1]):
            o = b - (top[h] - loads[g, h])
            if o > 0.0:
                pen += weights[h] * o
    return total_w * b - beta * pen


@njit(cache=True, nogil=True)
def _room(g, q, loads, hs, cap):
    """Largest total prompt ``q`` new requests may add to ``g`` under the KV capacity."""
    if not np.isfinite(cap):
        return np.inf
    r = np.inf
    for h in range(loads.shape[1]):
        v = cap - loads[g, h] - q * hs[h]
        if v < r:
            r = v
    return r


@njit(cache=True, nogil=True)
def _add(g, b, q, loads, top, hs):
    for h in range(loads.shape[1]):
        v = loads[g, h] + b + q * hs[h]
        loads[g, h] = v
        if v > top[h]:
            top[h] = v


@njit(cache=True, nogil=True)
def _admit(i, g, prompts, used, loads, top, hs, free, out_i, out_g, done):
    """Candidate ``i`` admitted to worker ``g`` as admission number ``done``; returns the
    next number."""
    used[i] = True
    _add(g, prompts[i], 1.0, loads, top, hs)
    free[g] -= 1
    out_i[done] = i
    out_g[done] = g
    return done + 1


@njit(cache=True, nogil=True)
def _window(used, start, size, out):
    """First ``size`` unused candidates from ``start``; returns how many were found."""
    k = 0
    i = start
    n = used.shape[0]
    while i < n and k < size:
        if not used[i]:
            out[k] = i
            k += 1
        i += 1
    return k


@njit(cache=True, nogil=True)
def _most_free(free, blocked, loads):
    """Stage 1's worker: the most free slots, then the smallest current load (``loads``
    ``(G,)``), then the lowest index, among the workers not ``blocked``; -1 when none is free."""
    g = -1
    for w in range(free.shape[0]):
        if free[w] == 0 or blocked[w]:
            continue
        if g < 0 or free[w] > free[g] or (free[w] == free[g] and loads[w] < loads[g]):
            g = w
    return g


@njit(cache=True, nogil=True)
def stage1_worker(free, loads):
    """The worker :func:`br_step`'s stage 1 takes first (nothing blocked yet)."""
    return _most_free(free, np.zeros(free.shape[0], dtype=np.bool_), loads)


@njit(cache=True, nogil=True)
def br_step(
    loads,
    free,
    prompts,
    overdue,
    bonus,
    weights,
    beta,
    penalty_max,
    cap,
    s_greedy,
    window,
    r_max,
    due,
    stats,
):
    """One BalanceRoute step. ``loads`` ``(G, H+1)`` and ``free`` are updated in place.

    ``bonus`` is added to the score of each candidate (of a subset: their sum) in stages 1
    and 2: the age priority (docs/design.md, "The queueing tail"). Returns ``(candidate
    indices, workers)`` in admission order.
    """
    g_count = loads.shape[0]
    h1 = loads.shape[1]
    n = prompts.shape[0]
    hs = np.arange(h1).astype(np.float64)
    total_w = 0.0
    for h in range(h1):
        total_w += weights[h]
    top = np.empty(h1)
    for h in range(h1):
        m = loads[0, h]
        for g in range(1, g_count):
            if loads[g, h] > m:
                m = loads[g, h]
        top[h] = m
    used = np.zeros(n, dtype=np.bool_)
    blocked = np.zeros(g_count, dtype=np.bool_)
    out_i = np.empty(due, dtype=np.int64)
    out_g = np.empty(due, dtype=np.int64)
    done = 0
    total_free = 0
    for g in range(g_count):
        total_free += free[g]
    first = 0
    buf = np.empty(max(window, r_max), dtype=np.int64)

    # fairness cap: overdue requests first, in pool order, each where it scores best
    for i in range(n):
        if done == due:
            break
        if not overdue[i]:
            continue
        best_g = -1
        best_s = -np.inf
        for g in range(g_count):
            if free[g] == 0 or blocked[g]:
                continue
            if prompts[i] > _room(g, 1.0, loads, hs, cap):
                continue
            s = _score(prompts[i], g, loads, top, weights, total_w, beta, penalty_max)
            if s > best_s:
                best_s = s
                best_g = g
        if best_g < 0:
            continue
        done = _admit(i, best_g, prompts, used, loads, top, hs, free, out_i, out_g, done)
        total_free -= 1
        stats[FAIRNESS] += 1

    # stage 1: the worker with the most free slots takes the best single request of the window
    while done < due and total_free > s_greedy:
        g = _most_free(free, blocked, loads[:, 0])
        if g < 0:
            break
        while first < n and used[first]:
            first += 1
        k = _window(used, first, window, buf)
        if k == 0:
            break
        room = _room(g, 1.0, loads, hs, cap)
        best = -1
        best_s = -np.inf
        for j in range(k):
            b = prompts[buf[j]]
            if b > room:
                continue
            s = _score(b, g, loads, top, weights, total_w, beta, penalty_max) + bonus[buf[j]]
            if s > best_s:
                best_s = s
                best = buf[j]
        if best < 0:
            blocked[g] = True
            continue
        done = _admit(best, g, prompts, used, loads, top, hs, free, out_i, out_g, done)
        total_free -= 1
        stats[STAGE1] += 1

    # stage 2: workers in descending (free, min margin) take the best subset of the head
    visited = np.zeros(g_count, dtype=np.bool_)
    while done < due:
        visited[:] = False
        progressed = False
        while done < due:
            g = -1
            gq = 0.0
            for w in range(g_count):
                if free[w] == 0 or blocked[w] or visited[w]:
                    continue
                q = np.inf
                for h in range(h1):
                    v = top[h] - loads[w, h]
                    if v < q:
                        q = v
                if g < 0 or free[w] > free[g] or (free[w] == free[g] and q > gq):
                    g = w
                    gq = q
            if g < 0:
                break
            visited[g] = True
            while first < n and used[first]:
                first += 1
            k = _window(used, first, r_max, buf)
            if k == 0:
                break
            size = min(free[g], due - done)
            best_code = 0
            best_s = -np.inf
            best_single = 0
            best_single_s = -np.inf
            for code in range(1, 1 << k):
                q = 0
                b = 0.0
                extra = 0.0
                for j in range(k):
                    if code >> j & 1:
                        q += 1
                        b += prompts[buf[j]]
                        extra += bonus[buf[j]]
                if q > size or b > _room(g, float(q), loads, hs, cap):
                    continue
                s = _score(b, g, loads, top, weights, total_w, beta, penalty_max) + extra
                if s > best_s:
                    best_s = s
                    best_code = code
                if q == 1 and s > best_single_s:
                    best_single_s = s
                    best_single = code
            if best_code == 0:
                blocked[g] = True
                continue
            if best_s <= 0.0 and best_code != best_single:
                best_code = best_single
                stats[FALLBACK] += 1
            q = 0
            b = 0.0
            for j in range(k):
                if best_code >> j & 1:
                    i = buf[j]
                    used[i] = True
                    out_i[done] = i
                    out_g[done] = g
                    done += 1
                    q += 1
                    b += prompts[i]
            _add(g, b, float(q), loads, top, hs)
            free[g] -= q
            total_free -= q
            stats[STAGE2] += q
            progressed = True
        if not progressed:
            break
    return out_i[:done], out_g[:done]


@njit(cache=True, nogil=True)
def age_bonus(passed, scale, late):
    """The age priority's score bonus per candidate (the pool's head, in order): ``scale`` per
    later admission that passed it, with ``late`` only those beyond its index in the pool
    (the older requests still waiting), never below 0."""
    out = np.empty(passed.shape[0])
    for j in range(passed.shape[0]):
        v = passed[j] - j if late else passed[j]
        out[j] = v * scale if v > 0 else 0.0
    return out


def compile_kernels() -> None:
    """Load (or compile) the step and projection kernels now, so the first routing call does
    not pay for it."""
    loads = np.zeros((2, 2))
    br_step(
        loads,
        np.ones(2, dtype=np.int64),
        np.ones(2),
        np.zeros(2, dtype=np.bool_),
        np.zeros(2),
        np.ones(2),
        2.0,
        False,
        np.inf,
        0,
        2,
        2,
        1,
        np.zeros(4, dtype=np.int64),
    )
    age_bonus(np.zeros(2, dtype=np.int64), 1.0, True)
    projection = LoadProjection(2, 2, 1, 2)
    projection.rebuild_cutoff(
        0, np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.ones(1), np.ones(1)
    )
    projection.remove(np.zeros(1, dtype=np.int64))
    one = np.zeros(1, dtype=np.int64)
    conditioned_loads(
        one, one, one, np.ones(1), np.ones((1, 3)), one, np.ones(1, dtype=np.bool_), 1.0, 1
    )

"""A plain-Python transcription of the two stages (docs/design.md, "BR-0 and BR-H"): the test oracle for the compiled kernel.

Slow and obvious on purpose: lists, explicit loops, one rule per block. Ties go to the first
candidate (pool order), the first worker index and the first subset in bit-pattern order.
"""

from __future__ import annotations

import math


def score(b, margins, weights, beta, penalty_max):
    total = sum(weights)
    if penalty_max:
        pen = max(0.0, max(b - m for m in margins)) * total
    else:
        pen = 0.0
        for w, m in zip(weights, margins, strict=True):
            if b - m > 0.0:
                pen += w * (b - m)
    return total * b - beta * pen


def best_subset(
    prompts, margins, weights, beta, max_size, penalty_max=False, room=None, bonus=None
):
    """Best non-empty subset of at most ``max_size`` candidates, and the best single one.

    ``room(q)`` is the largest total prompt a subset of size ``q`` may have (KV capacity);
    ``bonus[j]`` is added to the score of any subset holding candidate ``j`` (age priority).
    Returns ``(subset, score, single, single_score)`` with indices into ``prompts``.
    """
    best, best_s, single, single_s = None, -math.inf, None, -math.inf
    for code in range(1, 2 ** len(prompts)):
        subset = [j for j in range(len(prompts)) if code >> j & 1]
        b = sum(prompts[j] for j in subset)
        if len(subset) > max_size or (room is not None and b > room(len(subset))):
            continue
        s = score(b, margins, weights, beta, penalty_max)
        if bonus is not None:
            s += sum(bonus[j] for j in subset)
        if s > best_s:
            best, best_s = subset, s
        if len(subset) == 1 and s > single_s:
            single, single_s = subset, s
    return best, best_s, single, single_s


def reference_step(
    loads,
    free,
    prompts,
    overdue,
    weights,
    beta,
    penalty_max,
    cap,
    s_greedy,
    window,
    r_max,
    due,
    bonus=None,
):
    bonus = [0.0] * len(prompts) if bonus is None else list(bonus)
    loads = [list(row) for row in loads]
    free = list(free)
    h1 = len(loads[0])
    top = [max(row[h] for row in loads) for h in range(h1)]
    used = [False] * len(prompts)
    blocked = [False] * len(loads)
    out = []

    def margins(g):
        return [top[h] - loads[g][h] for h in range(h1)]

    def room(g, q):
        if math.isinf(cap):
            return math.inf
        return min(cap - loads[g][h] - q * h for h in range(h1))

    def admit(idxs, g):
        b = sum(prompts[i] for i in idxs)
        for i in idxs:
            used[i] = True
            out.append((i, g))
        for h in range(h1):
            loads[g][h] = loads[g][h] + b + len(idxs) * h
            top[h] = max(top[h], loads[g][h])
        free[g] -= len(idxs)

    def open_workers():
        return [g for g in range(len(free)) if free[g] > 0 and not blocked[g]]

    def head(size):
        return [i for i in range(len(prompts)) if not used[i]][:size]

    for i in range(len(prompts)):
        if len(out) == due:
            break
        if not overdue[i]:
            continue
        best, best_s = None, -math.inf
        for g in open_workers():
            if prompts[i] > room(g, 1):
                continue
            s = score(prompts[i], margins(g), weights, beta, penalty_max)
            if s > best_s:
                best, best_s = g, s
        if best is not None:
            admit([i], best)

    while len(out) < due and sum(free) > s_greedy:
        ws = open_workers()
        if not ws:
            break
        g = ws[0]
        for w in ws:
            if free[w] > free[g] or (free[w] == free[g] and loads[w][0] < loads[g][0]):
                g = w
        cands = head(window)
        if not cands:
            break
        best, best_s = None, -math.inf
        for i in cands:
            if prompts[i] > room(g, 1):
                continue
            s = score(prompts[i], margins(g), weights, beta, penalty_max) + bonus[i]
            if s > best_s:
                best, best_s = i, s
        if best is None:
            blocked[g] = True
            continue
        admit([best], g)

    while len(out) < due:
        visited = set()
        progressed = False
        while len(out) < due:
            ws = [w for w in open_workers() if w not in visited]
            if not ws:
                break
            g = ws[0]
            for w in ws:
                if free[w] > free[g] or (free[w] == free[g] and min(margins(w)) > min(margins(g))):
                    g = w
            visited.add(g)
            cands = head(r_max)
            if not cands:
                break
            size = min(free[g], due - len(out))
            best, best_s, single, _ = best_subset(
                [prompts[i] for i in cands],
                margins(g),
                weights,
                beta,
                size,
                penalty_max,
                lambda q, g=g: room(g, q),
                [bonus[i] for i in cands],
            )
            if best is not None:
                best, single = [cands[j] for j in best], [cands[j] for j in single]
            if best is None:
                blocked[g] = True
                continue
            if best_s <= 0.0 and len(best) > 1:
                best = single
            admit(best, g)
            progressed = True
        if not progressed:
            break
    return out

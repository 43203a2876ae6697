"""Training snapshots of a trace: which (request, age) rows the learned estimators train on."""

from __future__ import annotations

import numpy as np


def training_rows(
    output_tokens: np.ndarray,
    *,
    step: int = 8,
    per_request: int = 32,
    max_rows: int = 1_000_000,
    seed: int = 0,
    at_risk: bool = False,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request index, age, weight) training snapshots: ages on the grid ``0, step, 2*step, ...``.

    Each request keeps at most ``per_request`` grid ages, one drawn in each of that many equal
    strata of its grid (so they stay spread over its life), and the weights ``1/rows`` give every
    request the same total weight, like the evaluation's per-request snapshots; with ``at_risk``
    a request's rows weigh in total its output length, the iterations a router meets it running
    (time at risk), normalised to mean 1 over the rows. When the rows
    exceed ``max_rows``, a seeded random subset of requests is kept: the history features still
    come from every request, only the rows are thinned. Nothing of size (requests x grid) is built.
    """
    out = np.asarray(output_tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    grid = -(-out // step)  # ages 0, step, ... strictly below the output length
    k = np.minimum(grid, per_request)
    req = np.arange(out.size)
    if k.sum() > max_rows:
        keep = np.sort(rng.permutation(out.size)[: max(int(max_rows // max(k.mean(), 1)), 1)])
        req, k, grid = req[keep], k[keep], grid[keep]
    rows_req = np.repeat(req, k)
    j = np.arange(rows_req.size) - np.repeat(np.cumsum(k) - k, k)
    g = np.repeat(grid, k)
    kk = np.repeat(k, k)
    age = step * np.floor((j + rng.random(rows_req.size)) * g / kk).astype(np.int64)
    weight = np.repeat(out[req], k) / kk if at_risk else 1.0 / kk
    if at_risk:
        weight = weight / weight.mean()
    return rows_req, np.minimum(age, out[rows_req] - 1), weight


def person_period_rows(
    remaining: np.ndarray,
    ends: np.ndarray,
    *,
    survivor_fraction: float = 1.0,
    seed: int = 0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(snapshot, bin, event, weight) person-period rows of snapshots with remaining lengths
    ``r``: one row per bin the snapshot is at risk in, ``event = 1`` in the bin where it ends
    (``ends[j-1] < r <= ends[j]``), and no rows after it; a snapshot outliving the last bin
    survives every bin (censored at ``H``).

    ``survivor_fraction < 1`` keeps each non-event row with that probability and weight
    ``1 / survivor_fraction`` (event rows are always kept, with weight 1), which thins the rows
    of long requests without biasing the hazard's likelihood in expectation.
    """
    r = np.asarray(remaining, dtype=np.int64)
    ends = np.asarray(ends, dtype=np.int64)
    event_bin = np.searchsorted(ends, r, side="left")  # == ends.size when r > H
    at_risk = np.minimum(event_bin + 1, ends.size)
    snap = np.repeat(np.arange(r.size), at_risk)
    j = np.arange(snap.size) - np.repeat(np.cumsum(at_risk) - at_risk, at_risk)
    event = j == event_bin[snap]
    weight = np.ones(snap.size)
    if survivor_fraction < 1.0:
        keep = event | (np.random.default_rng(seed).random(snap.size) < survivor_fraction)
        snap, j, event = snap[keep], j[keep], event[keep]
        weight = np.where(event, 1.0, 1.0 / survivor_fraction)
    return snap, j, event.astype(np.float64), weight

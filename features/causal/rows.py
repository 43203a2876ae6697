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
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(request index, age, weight) training snapshots: ages on the grid ``0, step, 2*step, ...``.

    Each request keeps at most ``per_request`` grid ages, one drawn in each of that many equal
    strata of its grid (so they stay spread over its life), and the weights ``1/rows`` give every
    request the same total weight, like the evaluation's per-request snapshots. When the rows
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
    return rows_req, np.minimum(age, out[rows_req] - 1), 1.0 / kk

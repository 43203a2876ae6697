"""Seeded evaluation snapshots: a few random ages per test request, the same for every estimator."""

from __future__ import annotations

import numpy as np


def holdout_snapshots(
    output_tokens: np.ndarray, first: int, per_request: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(request index, age) with ``per_request`` ages uniform on ``0..O-1`` for requests >= first."""
    out = np.asarray(output_tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    idx = np.repeat(np.arange(first, out.size), per_request)
    age = np.floor(rng.random(idx.size) * out[idx]).astype(np.int64)
    return idx, np.minimum(age, out[idx] - 1)

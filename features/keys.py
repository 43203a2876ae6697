"""Prompt-key sources: which column groups requests into 'the same kind of prompt'.

A key is a uint64 per request, 0 meaning "no key". Sources:

- ``hash``: the trace's ``prompt_key`` column, already hashed by :func:`features.schema.hash_keys`;
- ``exact-length``: the exact prompt length (95% of Azure conversation rows share theirs);
- ``bucket``: the prompt-length quantile bucket, with edges fitted on the training history.
"""

from __future__ import annotations

import numpy as np

from balanceroute.features.errors import UserError

KEY_SOURCES: tuple[str, ...] = ("hash", "exact-length", "bucket")
AUTO_KEY = "auto"


def resolve_key_source(source: str, has_prompt_keys: bool) -> str:
    """``auto``: the prompt hash when the trace has keys, else the exact prompt length."""
    if source == AUTO_KEY:
        return "hash" if has_prompt_keys else "exact-length"
    return check_key_source(source)


def check_key_source(source: str) -> str:
    """Return ``source`` if it is a known key source, else raise a UserError listing them."""
    if source not in KEY_SOURCES:
        raise UserError(
            f"unknown key source '{source}'; known key sources: {', '.join(KEY_SOURCES)}"
        )
    return source


def fit_bucket_edges(prompt_tokens: np.ndarray, n_buckets: int) -> np.ndarray:
    """Interior quantile edges of prompt lengths, so each bucket holds about the same share."""
    qs = np.linspace(0.0, 1.0, int(n_buckets) + 1)[1:-1]
    if prompt_tokens.size == 0 or qs.size == 0:
        return np.zeros(0, dtype=np.float64)
    return np.unique(np.quantile(prompt_tokens.astype(np.float64), qs))


def derive_keys(
    source: str,
    prompt_tokens: np.ndarray,
    prompt_key: np.ndarray | None,
    bucket_edges: np.ndarray | None = None,
) -> np.ndarray:
    """uint64 keys of one source for a batch (0 where the source has no key)."""
    n = prompt_tokens.shape[0]
    if source == "hash":
        if prompt_key is None:
            return np.zeros(n, dtype=np.uint64)
        return np.asarray(prompt_key, dtype=np.uint64)
    if source == "exact-length":
        return np.asarray(prompt_tokens, dtype=np.int64).clip(min=1).astype(np.uint64)
    if source == "bucket":
        edges = np.zeros(0) if bucket_edges is None else bucket_edges
        return (np.searchsorted(edges, prompt_tokens, side="right") + 1).astype(np.uint64)
    check_key_source(source)
    raise AssertionError("unreachable")  # pragma: no cover

"""SHA-256 digests of trace files and frames, for resolved-configuration records."""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pandas as pd

FILE_BLOCK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes, read block by block."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as fh:
        while block := fh.read(FILE_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def path_sha256(path: str | Path, parts: list[Path] | None = None) -> str:
    """Hex SHA-256 of a file, or of a folder's parts (their names and digests, in order)."""
    if parts is None:
        return file_sha256(path)
    digest = hashlib.sha256()
    for part in parts:
        digest.update(f"{part.name}\x1f{file_sha256(part)}\x1e".encode())
    return digest.hexdigest()


def frame_sha256(trace: pd.DataFrame) -> str:
    """Hex SHA-256 of a canonical trace's content, identical across processes and platforms."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(trace["arrival_s"].to_numpy(dtype="<f8")).tobytes())
    for column in ("prompt_tokens", "output_tokens"):
        digest.update(np.ascontiguousarray(trace[column].to_numpy(dtype="<i8")).tobytes())
    for column in ("request_id", "prompt_key"):
        text = trace[column].astype("str").fillna("\x00")
        digest.update("\x1f".join(text.tolist()).encode())
    return digest.hexdigest()


def request_fingerprints(trace: pd.DataFrame) -> np.ndarray:
    """Sorted unique uint64 hashes of each request's ``(arrival_s, prompt_tokens,
    output_tokens)``: what a model fitted on ``trace`` has seen, compact enough to keep with it
    (8 bytes a request), so a later evaluation can tell whether its test requests were among
    them."""
    cols = trace[["arrival_s", "prompt_tokens", "output_tokens"]]
    return np.unique(pd.util.hash_pandas_object(cols, index=False).to_numpy(dtype=np.uint64))


def seen_requests(fingerprints: np.ndarray | None, trace: pd.DataFrame) -> int:
    """How many of ``trace``'s requests are among ``fingerprints`` (0 when there are none)."""
    if fingerprints is None or len(trace) == 0:
        return 0
    return int(np.isin(request_fingerprints(trace), fingerprints, assume_unique=True).sum())

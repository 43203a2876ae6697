"""Traces already in the canonical schema, as CSV, JSONL or Parquet.

Columns ``arrival_s``, ``prompt_tokens``, ``output_tokens`` are required; ``request_id`` and
``prompt_key`` are optional and read as text. Arrival times are kept as written (no shift), so
a trace written by :func:`features.trace_io.write_trace` reads back identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from balanceroute.features.errors import TraceError
from balanceroute.features.loaders.common import (
    CHUNK_ROWS,
    Sniff,
    TraceFormat,
    concat,
    iter_csv,
    iter_jsonl,
    require_columns,
)
from balanceroute.features.schema import REQUIRED_COLUMNS, as_seconds, length_columns

TEXT_COLUMNS = ("request_id", "prompt_key")


def _parquet_chunks(
    path: Path, columns: list[str], limit: int | None
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Record batches of the wanted Parquet columns with their 1-based rows."""
    done = 0
    try:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=CHUNK_ROWS, columns=columns):
            frame = batch.to_pandas()
            if limit is not None:
                frame = frame.iloc[: limit - done]
            yield frame, np.arange(done + 1, done + len(frame) + 1, dtype=np.int64)
            done += len(frame)
            if limit is not None and done >= limit:
                return
    except pa.ArrowException as exc:
        raise TraceError(f"not a readable Parquet file ({exc})", path=path) from None


def _chunks(
    path: Path, sniffed: Sniff, columns: list[str], limit: int | None
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Chunks of the wanted columns whatever the syntax, with their 1-based rows."""
    if sniffed.syntax == "parquet":
        yield from _parquet_chunks(path, columns, limit)
    elif sniffed.syntax == "jsonl":
        required = [c for c in columns if c in REQUIRED_COLUMNS]
        optional = [c for c in columns if c not in REQUIRED_COLUMNS]
        for values, rows in iter_jsonl(path, required, limit=limit, optional=optional):
            yield pd.DataFrame(values), rows
    else:
        text = [c for c in columns if c in TEXT_COLUMNS]
        yield from iter_csv(path, columns, limit=limit, text=text)


def read(path: Path, sniffed: Sniff, *, key_blocks: int, limit: int | None) -> pd.DataFrame:
    """Requests of a canonical CSV, JSONL or Parquet file in file order."""
    if sniffed.syntax != "jsonl":
        require_columns(sniffed.columns, REQUIRED_COLUMNS, path)
    present = [c for c in TEXT_COLUMNS if c in sniffed.columns]
    columns = [*REQUIRED_COLUMNS, *present]
    parts: dict[str, list[np.ndarray]] = {c: [] for c in columns}
    for chunk, rows in _chunks(path, sniffed, columns, limit):
        parts["arrival_s"].append(
            as_seconds(chunk["arrival_s"], source=path, field="arrival_s", rows=rows)
        )
        lengths = length_columns(chunk, "prompt_tokens", "output_tokens", source=path, rows=rows)
        for name, values in zip(("prompt_tokens", "output_tokens"), lengths, strict=True):
            parts[name].append(values)
        for name in present:
            parts[name].append(chunk[name].astype("str").to_numpy(dtype=object))
    frame = pd.DataFrame({"arrival_s": concat(parts["arrival_s"], np.float64)})
    for name in ("prompt_tokens", "output_tokens"):
        frame[name] = concat(parts[name], np.int64)
    for name in present:
        frame[name] = pd.array(concat(parts[name], object), dtype="str")
    return frame


FORMAT = TraceFormat(
    name="canonical",
    summary="canonical columns (arrival_s, prompt_tokens, output_tokens[, request_id, prompt_key])"
    " as CSV, JSONL or Parquet",
    syntaxes=("csv", "jsonl", "parquet"),
    columns=("arrival_s", "prompt_tokens", "output_tokens", "request_id", "prompt_key"),
    read=read,
)

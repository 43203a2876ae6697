"""Write canonical traces to CSV, Parquet or JSONL, atomically.

The frame goes to a temporary file in the destination folder, which is renamed over the
destination only once complete: a crash or an error never leaves a half-written trace.
:func:`features.loaders.load_trace` reads every one of these back unchanged.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

import orjson
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.files import atomic_output
from balanceroute.features.schema import validate_trace

JSONL_CHUNK_ROWS = 100_000


def _write_csv(frame: pd.DataFrame, fh: BinaryIO) -> None:
    """CSV with a header; missing keys are empty cells."""
    frame.to_csv(fh, index=False, lineterminator="\n")


def _write_parquet(frame: pd.DataFrame, fh: BinaryIO) -> None:
    """Parquet through pyarrow, without the index."""
    frame.to_parquet(fh, index=False, engine="pyarrow")


def _write_jsonl(frame: pd.DataFrame, fh: BinaryIO) -> None:
    """One JSON object a line; floats keep full precision; missing keys are null."""
    for start in range(0, len(frame), JSONL_CHUNK_ROWS):
        part = frame.iloc[start : start + JSONL_CHUNK_ROWS].astype(object)
        part = part.where(part.notna(), None)
        fh.write(b"".join(orjson.dumps(rec) + b"\n" for rec in part.to_dict("records")))


WRITERS: dict[str, Callable[[pd.DataFrame, BinaryIO], None]] = {
    ".csv": _write_csv,
    ".parquet": _write_parquet,
    ".jsonl": _write_jsonl,
}


def write_trace(frame: pd.DataFrame, path: str | Path) -> Path:
    """Validate ``frame`` and write it to ``path``, the format chosen by the extension."""
    target = Path(path)
    writer = WRITERS.get(target.suffix.lower())
    if writer is None:
        raise UserError(
            f"cannot write a trace to '{target}': unknown extension '{target.suffix}'; "
            f"supported: {', '.join(WRITERS)}"
        )
    if target.is_dir():
        raise UserError(f"cannot write a trace to '{target}': it is a directory")
    trace = validate_trace(frame, source="<frame to write>")
    with atomic_output(target) as tmp, tmp.open("wb") as fh:
        writer(trace, fh)
        fh.flush()
        os.fsync(fh.fileno())
    return target

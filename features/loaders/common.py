"""What every trace reader shares: file checks, sniffing, header matching and chunked reads.

Rows in error messages are 1-based data rows: row 1 is the first request; a CSV header and
blank lines are not rows. Readers work chunk by chunk and keep only the wanted columns, as
numeric arrays (plus short key strings), so a file of tens of millions of requests never sits
in memory as Python objects.
"""

from __future__ import annotations

import csv
import difflib
import operator
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import orjson
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from balanceroute.features.errors import TraceError

CHUNK_ROWS = 1_000_000
# JSONL records are Python objects until a chunk is converted: small chunks keep the garbage
# collector's work (it scans every live container) from growing with the file.
JSONL_CHUNK_ROWS = 65_536
SNIFF_BYTES = 64 * 1024
PARQUET_MAGIC = b"PAR1"
GZIP_MAGIC = b"\x1f\x8b"


@dataclass(frozen=True, slots=True)
class Sniff:
    """What the first bytes of a file say: its syntax and its column (or field) names."""

    syntax: str
    columns: tuple[str, ...]


class Reader(Protocol):
    """Reads a checked, sniffed file into canonical columns, rows in file order."""

    def __call__(
        self, path: Path, sniffed: Sniff, *, key_blocks: int, limit: int | None
    ) -> pd.DataFrame: ...


@dataclass(frozen=True, slots=True)
class TraceFormat:
    """A trace layout: its name, the syntaxes it comes in, the columns that identify it."""

    name: str
    summary: str
    syntaxes: tuple[str, ...]
    columns: tuple[str, ...]
    read: Reader


def check_file(path: str | Path) -> Path:
    """The path as a readable, non-empty regular file, or a TraceError saying what it is."""
    p = Path(path)
    if not p.exists():
        raise TraceError("no such file", path=path)
    if p.is_dir():
        raise TraceError("is a directory, not a trace file", path=path)
    if not p.is_file():
        raise TraceError("is not a regular file", path=path)
    try:
        size = p.stat().st_size
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror}", path=path) from None
    if size == 0:
        raise TraceError("the file is empty", path=path)
    return p


def sniff(path: Path) -> Sniff:
    """Syntax and column names of a checked file, from its first bytes only."""
    try:
        with path.open("rb") as fh:
            head = fh.read(SNIFF_BYTES)
    except OSError as exc:
        raise TraceError(f"cannot read: {exc.strerror}", path=path) from None
    if head.startswith(PARQUET_MAGIC):
        return Sniff("parquet", _parquet_columns(path))
    text = _decode_head(head, path, full=len(head) == SNIFF_BYTES)
    line = next((ln for ln in text.splitlines() if ln.strip()), None)
    if line is None:
        raise TraceError("the file is empty (only blank lines)", path=path)
    if line.lstrip().startswith("{"):
        record = parse_json_line(line.encode(), path=path, row=1)
        return Sniff("jsonl", tuple(record))
    return Sniff("csv", tuple(next(csv.reader([line]))))


def _decode_head(head: bytes, path: Path, *, full: bool) -> str:
    """The head as text; binary content (NUL bytes, invalid UTF-8) is a TraceError."""
    if head.startswith(GZIP_MAGIC):
        raise TraceError("is gzip-compressed; decompress it first", path=path)
    if full and b"\n" in head:
        head = head[: head.rindex(b"\n")]
    try:
        if b"\x00" in head:
            raise UnicodeDecodeError("utf-8", head, 0, 1, "NUL byte")
        return head.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TraceError(
            "is a binary file, not a trace (expected CSV, JSONL or Parquet)", path=path
        ) from None


def _parquet_columns(path: Path) -> tuple[str, ...]:
    """Column names from a Parquet footer, or a TraceError for an unreadable file."""
    try:
        return tuple(pq.ParquetFile(path).schema_arrow.names)
    except (pa.ArrowException, OSError) as exc:
        raise TraceError(f"not a readable Parquet file ({exc})", path=path) from None


def closest(name: str, candidates: Sequence[str]) -> str | None:
    """The candidate most like ``name`` (case-insensitive), if any is close enough."""
    lowered = {c.lower(): c for c in candidates}
    match = difflib.get_close_matches(name.lower(), list(lowered), n=1, cutoff=0.6)
    return lowered[match[0]] if match else None


def missing_message(name: str, found: Sequence[str], what: str = "column") -> str:
    """``missing column 'X' (did you mean 'Y'?)`` with the names that were found."""
    hint = closest(name, found)
    did_you_mean = f" (did you mean '{hint}'?)" if hint else ""
    return f"missing {what} '{name}'{did_you_mean}; found {list(found)}"


def require_columns(found: Sequence[str], wanted: Sequence[str], path: Path) -> None:
    """Raise a TraceError for the first wanted column absent from the header."""
    for name in wanted:
        if name not in found:
            raise TraceError(missing_message(name, found), path=path, field=name)


def match_score(found: Sequence[str], wanted: Sequence[str]) -> float:
    """How well a header fits a layout: 1 per exact column, 0.5 per near miss."""
    score = 0.0
    for name in wanted:
        if name in found:
            score += 1.0
        elif closest(name, found) is not None:
            score += 0.5
    return score


# The C parser counts physical lines from 1 with the header ("line 5" is data row 4), but
# numbers rows from 0 at the header ("row 3" is data row 3).
_WHERE = re.compile(r"\b(line|row) (\d+)")


def iter_csv(
    path: Path,
    columns: Sequence[str],
    *,
    limit: int | None,
    text: Sequence[str] = (),
) -> Iterator[tuple[pd.DataFrame, np.ndarray]]:
    """Chunks of the wanted CSV columns with their 1-based data rows; pandas errors become
    TraceErrors naming the row.

    Columns are picked by header name: fields past the header's last column are ignored.
    ``text`` columns are read as strings. Only empty cells are missing: a key spelt ``NA`` or
    ``null`` stays a key, and ``nan`` in a length column is reported, not skipped.
    """
    chunk = CHUNK_ROWS if limit is None else max(1, min(CHUNK_ROWS, limit))
    try:
        reader = pd.read_csv(
            path,
            usecols=list(columns),
            dtype=dict.fromkeys(text, str),
            keep_default_na=False,
            na_values={name: [""] for name in columns},
            nrows=limit,
            chunksize=chunk,
            encoding="utf-8-sig",
        )
        with reader:
            for frame in reader:
                yield frame, frame.index.to_numpy(dtype=np.int64) + 1
    except pd.errors.ParserError as exc:
        detail = str(exc).split("C error: ")[-1]
        found = _WHERE.search(detail)
        row = None
        if found:
            row = int(found.group(2)) - (found.group(1) == "line")
        raise TraceError(f"malformed CSV: {detail}", path=path, row=row) from None
    except UnicodeDecodeError:
        raise TraceError("is not UTF-8 text past its first bytes", path=path) from None


def parse_json_line(line: bytes, *, path: Path, row: int) -> dict[str, Any]:
    """One JSONL record as a dict, or a TraceError naming the row."""
    try:
        record = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceError(f"not valid JSON ({exc})", path=path, row=row) from None
    if not isinstance(record, dict):
        raise TraceError(f"expected a JSON object, got {type(record).__name__}", path=path, row=row)
    return record


def _missing_field(record: dict[str, Any], fields: Sequence[str], path: Path, row: int) -> None:
    """Raise the TraceError for the first of ``fields`` absent from ``record``."""
    name = next(name for name in fields if name not in record)
    raise TraceError(
        missing_message(name, list(record), what="field"), path=path, row=row, field=name
    )


def iter_jsonl(
    path: Path,
    fields: Sequence[str],
    *,
    limit: int | None,
    optional: Sequence[str] = (),
    reduce: Mapping[str, Callable[[Any], Any]] | None = None,
) -> Iterator[tuple[dict[str, list[Any]], np.ndarray]]:
    """Chunks of JSONL field values (lists) with their 1-based data rows, line by line.

    ``reduce`` shrinks a field as it is read (e.g. keep the first hashes of a long list), so
    large per-line values never accumulate; blank lines are skipped and are not rows.
    """
    required = operator.itemgetter(*fields)
    single = len(fields) == 1
    reducers = [(i, fn) for i, name in enumerate(fields) if (fn := (reduce or {}).get(name))]
    records: list[tuple[Any, ...]] = []
    row = done = 0
    with path.open("rb") as fh:
        for line in fh:
            if len(line) < 3 and not line.strip():
                continue
            row += 1
            if limit is not None and row > limit:
                break
            record = parse_json_line(line, path=path, row=row)
            try:
                values = required(record)
            except KeyError:
                _missing_field(record, fields, path, row)
            values = (values,) if single else values
            if reducers:
                values = list(values)
                for i, fn in reducers:
                    values[i] = fn(values[i])
            if optional:
                values = (*values, *(record.get(name) for name in optional))
            records.append(values)
            if len(records) >= JSONL_CHUNK_ROWS:
                yield _columns(records, fields, optional), np.arange(done + 1, row + 1)
                records, done = [], row
    if records:
        yield _columns(records, fields, optional), np.arange(done + 1, row + 1)


def _columns(
    records: list[tuple[Any, ...]], fields: Sequence[str], optional: Sequence[str]
) -> dict[str, list[Any]]:
    """Per-record value tuples turned into one list per field."""
    return {
        name: list(col)
        for name, col in zip((*fields, *optional), zip(*records, strict=True), strict=True)
    }


def concat(parts: list[np.ndarray], dtype: Any) -> np.ndarray:
    """Concatenate chunk arrays and empty the list, so the chunks are freed at once; an empty
    list gives an empty array of ``dtype``."""
    whole = np.concatenate(parts).astype(dtype, copy=False) if parts else np.empty(0, dtype=dtype)
    parts.clear()
    return whole


def since_first(times: np.ndarray) -> np.ndarray:
    """Times shifted in place so the earliest request arrives at 0."""
    if times.size:
        times -= times.min()
    return times

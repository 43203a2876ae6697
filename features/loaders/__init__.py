"""Read request traces of every supported layout into the canonical schema.

``load_trace(path)`` sniffs the layout from the file's content (``format=`` forces one) and
returns a frame accepted by :func:`features.schema.validate_trace`. A folder is read as the
union of its parts (``*.parquet``, ``*.csv``, ``*.jsonl`` directly inside it, such as the
gateway's completion log), each read like a file, rows ordered by arrival. Bad input raises
:class:`~features.errors.TraceError` naming the file, the 1-based data row (row 1 is the first
request; a CSV header and blank lines are not rows) and the field.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from balanceroute.features.errors import TraceError, UserError
from balanceroute.features.loaders import azure, burstgpt, canonical, mooncake
from balanceroute.features.loaders.common import Sniff, TraceFormat, check_file, match_score, sniff
from balanceroute.features.schema import validate_trace

FORMATS: dict[str, TraceFormat] = {
    f.name: f for f in (azure.FORMAT, mooncake.FORMAT, burstgpt.FORMAT, canonical.FORMAT)
}
AUTO = "auto"

__all__ = ["AUTO", "FORMATS", "detect_format", "format_names", "load_trace", "trace_parts"]
PART_SUFFIXES = (".parquet", ".csv", ".jsonl")


def format_names() -> list[str]:
    """Names accepted by ``format=`` and ``--format`` (besides ``auto``)."""
    return list(FORMATS)


def _best_format(path: Path, sniffed: Sniff) -> str:
    """The registered layout whose columns best match the sniffed header."""
    scores = {
        name: match_score(sniffed.columns, fmt.columns)
        for name, fmt in FORMATS.items()
        if sniffed.syntax in fmt.syntaxes
    }
    best = max(scores, key=lambda name: scores[name])
    if scores[best] < 1.0:
        raise TraceError(
            f"cannot tell the trace format from its {sniffed.syntax.upper()} columns "
            f"{list(sniffed.columns)}; expected one of: "
            + "; ".join(f"{n} ({', '.join(FORMATS[n].columns)})" for n in scores),
            path=path,
        )
    return best


def trace_parts(path: str | Path) -> list[Path] | None:
    """The part files of a trace folder in name order (None when ``path`` is not a folder);
    a TraceError when the folder holds none."""
    folder = Path(path)
    if not folder.is_dir():
        return None
    parts = sorted(
        p
        for p in folder.iterdir()
        if p.is_file() and p.suffix in PART_SUFFIXES and not p.name.startswith(".")
    )
    if not parts:
        raise TraceError(
            f"the folder holds no trace parts ({', '.join('*' + s for s in PART_SUFFIXES)})",
            path=path,
        )
    return parts


def detect_format(path: str | Path) -> str:
    """The name of the layout of a trace file (of a folder: of its first part), judged by its
    content, not its extension."""
    parts = trace_parts(path)
    if parts is not None:
        return detect_format(parts[0])
    checked = check_file(path)
    return _best_format(checked, sniff(checked))


def _resolve(path: Path, sniffed: Sniff, format: str) -> TraceFormat:
    """The layout to read with: detected for ``auto``, else the forced one if it fits."""
    if format == AUTO:
        return FORMATS[_best_format(path, sniffed)]
    try:
        fmt = FORMATS[format]
    except KeyError:
        raise UserError(
            f"unknown trace format '{format}'; known formats: {', '.join([AUTO, *FORMATS])}"
        ) from None
    if sniffed.syntax not in fmt.syntaxes:
        raise TraceError(
            f"format '{fmt.name}' reads {'/'.join(s.upper() for s in fmt.syntaxes)}, "
            f"but this file is {sniffed.syntax.upper()}",
            path=path,
        )
    return fmt


def load_trace(
    path: str | Path, *, format: str = AUTO, key_blocks: int = 2, limit: int | None = None
) -> pd.DataFrame:
    """Requests of a trace file as a validated canonical frame, sorted by arrival.

    ``key_blocks`` is the number of leading Mooncake hash blocks forming the prompt key;
    ``limit`` reads only the first N requests of the file.
    """
    if key_blocks < 1:
        raise UserError(f"key_blocks must be at least 1, got {key_blocks}")
    if limit is not None and limit < 1:
        raise UserError(f"limit must be at least 1 request, got {limit}")
    parts = trace_parts(path)
    if parts is not None:
        frames = [load_trace(p, format=format, key_blocks=key_blocks) for p in parts]
        frame = validate_trace(pd.concat(frames, ignore_index=True), source=path)
        return frame if limit is None else frame.iloc[:limit].reset_index(drop=True)
    checked = check_file(path)
    sniffed = sniff(checked)
    fmt = _resolve(checked, sniffed, format)
    frame = fmt.read(checked, sniffed, key_blocks=key_blocks, limit=limit)
    return validate_trace(frame, source=path)

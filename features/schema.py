"""The canonical trace schema: one row a request, in release order.

Columns: ``request_id`` (str), ``arrival_s`` (float seconds from trace start), ``prompt_tokens``
(int > 0), ``output_tokens`` (int >= 1), ``prompt_key`` (str or missing). Every loader and the
synthetic generator return a frame that :func:`validate_trace` accepts.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.errors import TraceError
from balanceroute.features.limits import input_limits

try:  # pandas' own SipHash of object arrays (what ``pd.util.hash_array`` calls)
    from pandas._libs.hashing import hash_object_array as _hash_object_array
except ImportError:  # pragma: no cover - a pandas that moved it
    _hash_object_array = None
_PANDAS_HASH_KEY = "0123456789123456"  # pandas' default hash key
_U64 = (1 << 64) - 1

CANONICAL_COLUMNS: tuple[str, ...] = (
    "request_id",
    "arrival_s",
    "prompt_tokens",
    "output_tokens",
    "prompt_key",
)
REQUIRED_COLUMNS: tuple[str, ...] = ("arrival_s", "prompt_tokens", "output_tokens")


def _first_bad(mask: np.ndarray) -> int:
    """0-based position of the first True in ``mask``."""
    return int(np.flatnonzero(mask)[0])


def _row(rows: np.ndarray | None, position: int) -> int:
    """1-based data row of a position: ``rows[position]`` if given, else ``position + 1``."""
    return int(rows[position]) if rows is not None else position + 1


def as_token_counts(
    values: pd.Series,
    *,
    source: object = "<trace>",
    field: str = "tokens",
    rows: np.ndarray | None = None,
    most: int | None = None,
) -> np.ndarray:
    """Whole token counts in ``[1, most]`` as int64, so every reader rejects bad lengths the
    same way (``most`` defaults to the prompt bound of :mod:`balanceroute.features.limits`).

    Raises :class:`TraceError` naming ``source``, ``field`` (the file's own column) and the
    1-based data row of the first bad value (row 1 is the first request; ``rows`` maps
    positions to file rows).
    """
    most = input_limits().max_prompt_tokens if most is None else most
    raw = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(raw) | (raw != np.round(raw))
    if bad.any():
        i = _first_bad(bad)
        shown = values.iloc[i]
        empty = pd.isna(shown) or (isinstance(shown, str) and not shown.strip())
        got = "an empty value" if empty else repr(shown)
        raise TraceError(
            f"expected a whole number of tokens, got {got}",
            path=source,
            row=_row(rows, i),
            field=field,
        )
    for bad, what in ((raw < 1, "must be at least 1"), (raw > most, f"must be at most {most:,}")):
        if bad.any():
            i = _first_bad(bad)
            raise TraceError(
                f"{what}, got {raw[i]:,.0f}", path=source, row=_row(rows, i), field=field
            )
    return raw.astype(np.int64)


def length_columns(
    chunk: Any, prompt: str, output: str, *, source: object, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Prompt and output token counts of a chunk's ``prompt`` and ``output`` columns, each
    checked against its input limit (errors name the file's own column)."""
    lim = input_limits()
    return (
        as_token_counts(
            chunk[prompt], source=source, field=prompt, rows=rows, most=lim.max_prompt_tokens
        ),
        as_token_counts(
            chunk[output], source=source, field=output, rows=rows, most=lim.max_output_tokens
        ),
    )


def as_seconds(
    values: pd.Series,
    *,
    source: object = "<trace>",
    field: str = "arrival_s",
    rows: np.ndarray | None = None,
) -> np.ndarray:
    """Finite float64 times, so every reader rejects unparseable times the same way."""
    raw = pd.to_numeric(values, errors="coerce").to_numpy(dtype=np.float64, na_value=np.nan)
    bad = ~np.isfinite(raw)
    if bad.any():
        i = _first_bad(bad)
        raise TraceError(
            f"unparseable arrival time {values.iloc[i]!r}",
            path=source,
            row=_row(rows, i),
            field=field,
        )
    return raw


def validate_trace(frame: pd.DataFrame, source: object = "<trace>") -> pd.DataFrame:
    """Check a frame against the canonical schema and return it typed, sorted by arrival.

    Raises :class:`TraceError` naming ``source``, the 1-based row and the field for the first
    violation found. Rows are stably sorted by ``arrival_s`` so ties keep their file order.
    Missing prompt keys are NA (test them with ``isna()``).
    """
    if len(frame) == 0:
        raise TraceError("the trace holds no requests", path=source)
    missing = [c for c in REQUIRED_COLUMNS if c not in frame.columns]
    if missing:
        raise TraceError(
            f"missing column(s) {missing}; a canonical trace has {list(CANONICAL_COLUMNS)} "
            f"(found {list(frame.columns)})",
            path=source,
            field=missing[0],
        )
    out = pd.DataFrame(index=pd.RangeIndex(len(frame)))
    lim = input_limits()
    out["prompt_tokens"], out["output_tokens"] = length_columns(
        frame, "prompt_tokens", "output_tokens", source=source
    )
    arrival = as_seconds(frame["arrival_s"], source=source, field="arrival_s")
    late = (arrival < 0) | (arrival > lim.max_arrival_s)
    if late.any():
        i = _first_bad(late)
        raise TraceError(
            f"arrival time must be >= 0 and <= {lim.max_arrival_s:g} seconds from the trace's "
            f"start, got {arrival[i]:g}",
            path=source,
            row=i + 1,
            field="arrival_s",
        )
    out["arrival_s"] = arrival
    if "request_id" in frame.columns:
        out["request_id"] = frame["request_id"].astype("str").array
    else:
        out["request_id"] = pd.Series(np.arange(len(frame))).astype("str").array
    if "prompt_key" in frame.columns:
        out["prompt_key"] = frame["prompt_key"].astype("str").array
    else:
        out["prompt_key"] = pd.Series(index=out.index, dtype="str").array
    out = out[list(CANONICAL_COLUMNS)]
    order = np.argsort(out["arrival_s"].to_numpy(), kind="stable")
    if not np.array_equal(order, np.arange(len(out))):
        out = out.iloc[order]
    return out.reset_index(drop=True)


@dataclass(frozen=True, slots=True)
class TraceArrays:
    """The numpy view of a canonical trace that the simulator and estimators consume."""

    arrival_s: np.ndarray  # float64 (N,)
    prompt_tokens: np.ndarray  # int64 (N,)
    output_tokens: np.ndarray  # int64 (N,)
    prompt_key: np.ndarray  # uint64 (N,) stable hash of prompt_key; 0 where missing

    @property
    def size(self) -> int:
        return int(self.prompt_tokens.shape[0])


def hash_keys(keys: pd.Series | np.ndarray | list) -> np.ndarray:
    """Stable 64-bit hashes of prompt keys (0 for a missing key), identical across processes."""
    arr = pd.Series(keys, dtype=object)
    missing = arr.isna().to_numpy()
    hashed = pd.util.hash_array(arr.fillna("").astype(str).to_numpy(dtype=object))
    hashed = hashed.astype(np.uint64)
    hashed[hashed == 0] = 1
    hashed[missing] = 0
    return hashed


@lru_cache(maxsize=4096)  # a gateway sees the same few prefixes (system prompts) again and again
def hash_key(key: str) -> int:
    """One prompt key's :func:`hash_keys` hash, without building a Series (a gateway hashes one
    key per request): pandas' SipHash of the key's UTF-8 bytes, then its 64-bit mixing step,
    in 2 us where ``pd.util.hash_array`` takes 10 us and :func:`hash_keys` about 1 ms."""
    if _hash_object_array is None:  # a pandas without the private function: the public path
        return int(pd.util.hash_array(np.array([key], dtype=object), categorize=False)[0]) or 1
    h = int(_hash_object_array(np.array([key], dtype=object), _PANDAS_HASH_KEY, "utf8")[0])
    h ^= h >> 30
    h = (h * 0xBF58476D1CE4E5B9) & _U64
    h ^= h >> 27
    h = (h * 0x94D049BB133111EB) & _U64
    h ^= h >> 31
    return h or 1


def to_arrays(trace: pd.DataFrame) -> TraceArrays:
    """Columns of a validated trace as contiguous arrays (keys hashed to uint64)."""
    return TraceArrays(
        arrival_s=np.ascontiguousarray(trace["arrival_s"].to_numpy(dtype=np.float64)),
        prompt_tokens=np.ascontiguousarray(trace["prompt_tokens"].to_numpy(dtype=np.int64)),
        output_tokens=np.ascontiguousarray(trace["output_tokens"].to_numpy(dtype=np.int64)),
        prompt_key=hash_keys(trace["prompt_key"]),
    )

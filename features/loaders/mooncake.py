"""Mooncake traces (JSONL): ``timestamp`` (ms), ``input_length``, ``output_length``, ``hash_ids``.

``hash_ids`` are the hashes of the prompt's 512-token blocks; requests that share their first
blocks share a prefix. The prompt key is the first ``key_blocks`` hashes joined by ``-`` (e.g.
``0-14``); only those are kept while reading, never the whole list.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.errors import TraceError
from balanceroute.features.loaders.common import Sniff, TraceFormat, concat, iter_jsonl, since_first
from balanceroute.features.schema import as_seconds, length_columns

TIME, PROMPT, OUTPUT, HASHES = "timestamp", "input_length", "output_length", "hash_ids"


@dataclass(frozen=True, slots=True)
class _NotHashes:
    """Marks a ``hash_ids`` value that is not a list, to report with its row after the chunk."""

    value: Any


def key_reader(key_blocks: int) -> Callable[[Any], str | _NotHashes | None]:
    """Per-line reducer: the ``'-'``-joined first hashes (None for an empty list), so the
    full list is dropped as soon as its line is parsed."""

    def key(hashes: Any) -> str | _NotHashes | None:
        if not isinstance(hashes, list):
            return _NotHashes(hashes)
        return "-".join(map(str, hashes[:key_blocks])) if hashes else None

    return key


def check_keys(keys: list[Any], *, path: Path, rows: np.ndarray) -> list[Any]:
    """The chunk's keys, or a TraceError at the first ``hash_ids`` that was not a list."""
    for i, key in enumerate(keys):
        if isinstance(key, _NotHashes):
            raise TraceError(
                f"expected a list of block hashes, got {key.value!r}",
                path=path,
                row=int(rows[i]),
                field=HASHES,
            )
    return keys


def read(path: Path, sniffed: Sniff, *, key_blocks: int, limit: int | None) -> pd.DataFrame:
    """Requests of a Mooncake JSONL file in file order, keyed by their first hash blocks."""
    times, prompts, outputs, keys = [], [], [], []
    chunks = iter_jsonl(
        path, (TIME, PROMPT, OUTPUT, HASHES), limit=limit, reduce={HASHES: key_reader(key_blocks)}
    )
    for values, rows in chunks:
        times.append(as_seconds(pd.Series(values[TIME]), source=path, field=TIME, rows=rows))
        columns = {name: pd.Series(values[name]) for name in (PROMPT, OUTPUT)}
        prompt, output = length_columns(columns, PROMPT, OUTPUT, source=path, rows=rows)
        prompts.append(prompt)
        outputs.append(output)
        keys.extend(check_keys(values[HASHES], path=path, rows=rows))
    return pd.DataFrame(
        {
            "arrival_s": since_first(concat(times, np.float64)) / 1000.0,
            "prompt_tokens": concat(prompts, np.int64),
            "output_tokens": concat(outputs, np.int64),
            "prompt_key": pd.array(keys, dtype="str"),
        },
        copy=False,
    )


FORMAT = TraceFormat(
    name="mooncake",
    summary="Mooncake JSONL trace (timestamp ms, input/output_length, hash_ids)",
    syntaxes=("jsonl",),
    columns=(TIME, PROMPT, OUTPUT, HASHES),
    read=read,
)

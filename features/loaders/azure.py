"""Azure LLM inference traces (2023 and 2024 releases): ``TIMESTAMP,ContextTokens,GeneratedTokens``.

2023 timestamps are naive wall-clock times with 100 ns digits (``2023-11-16 18:15:46.6805900``);
2024 ones carry an offset and sometimes no fraction (``2024-05-10 00:00:00.009930+00:00``,
``2024-05-12 00:00:00+00:00``). Both parse as ISO 8601; arrivals are seconds since the earliest
request. The traces carry no prompt text, so ``prompt_key`` stays empty: the exact prompt length
is already in ``prompt_tokens`` for any estimator that wants to key on it.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.features.errors import TraceError
from balanceroute.features.loaders.common import (
    Sniff,
    TraceFormat,
    concat,
    iter_csv,
    require_columns,
    since_first,
)
from balanceroute.features.schema import length_columns

TIME, PROMPT, OUTPUT = "TIMESTAMP", "ContextTokens", "GeneratedTokens"


def parse_timestamps(values: pd.Series, *, path: Path, rows: np.ndarray) -> np.ndarray:
    """ISO 8601 wall-clock strings as int64 UTC nanoseconds (naive times are taken as UTC)."""
    parsed = pd.to_datetime(values, format="ISO8601", utc=True, errors="coerce")
    bad = parsed.isna().to_numpy()
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raw = values.iloc[i]
        got = "an empty value" if pd.isna(raw) else repr(raw)
        raise TraceError(
            f"unparseable timestamp {got} (expected e.g. '2023-11-16 18:15:46.6805900')",
            path=path,
            row=int(rows[i]),
            field=TIME,
        )
    naive = parsed.dt.tz_convert(None).to_numpy().astype("datetime64[ns]")
    return naive.astype(np.int64)


def read(path: Path, sniffed: Sniff, *, key_blocks: int, limit: int | None) -> pd.DataFrame:
    """Requests of an Azure CSV in file order (``key_blocks`` does not apply)."""
    require_columns(sniffed.columns, (TIME, PROMPT, OUTPUT), path)
    times, prompts, outputs = [], [], []
    for chunk, rows in iter_csv(path, (TIME, PROMPT, OUTPUT), limit=limit, text=(TIME,)):
        times.append(parse_timestamps(chunk[TIME], path=path, rows=rows))
        prompt, output = length_columns(chunk, PROMPT, OUTPUT, source=path, rows=rows)
        prompts.append(prompt)
        outputs.append(output)
    ns = since_first(concat(times, np.int64))
    return pd.DataFrame(
        {
            "arrival_s": ns / 1e9,
            "prompt_tokens": concat(prompts, np.int64),
            "output_tokens": concat(outputs, np.int64),
        },
        copy=False,
    )


FORMAT = TraceFormat(
    name="azure",
    summary="Azure LLM inference trace CSV (2023 or 2024 layout)",
    syntaxes=("csv",),
    columns=(TIME, PROMPT, OUTPUT),
    read=read,
)

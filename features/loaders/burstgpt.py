"""BurstGPT traces (CSV): ``Timestamp`` (s), ``Model``, ``Request tokens``, ``Response tokens``,
``Total tokens``, ``Log Type``.

Rows with ``Response tokens == 0`` are failed requests: they are dropped and counted in a
:class:`~features.errors.DroppedRowsWarning` (never silently). ``limit`` counts kept requests.
Request ids keep the file row (``request_id = row - 1``) so dropped rows leave visible gaps.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.features.errors import DroppedRowsWarning
from balanceroute.features.loaders.common import (
    Sniff,
    TraceFormat,
    concat,
    iter_csv,
    require_columns,
    since_first,
)
from balanceroute.features.schema import as_seconds, length_columns

TIME, PROMPT, OUTPUT = "Timestamp", "Request tokens", "Response tokens"
ALL_COLUMNS = (TIME, "Model", PROMPT, OUTPUT, "Total tokens", "Log Type")


def read(path: Path, sniffed: Sniff, *, key_blocks: int, limit: int | None) -> pd.DataFrame:
    """Successful requests of a BurstGPT CSV in file order (``key_blocks`` does not apply)."""
    require_columns(sniffed.columns, (TIME, PROMPT, OUTPUT), path)
    times, prompts, outputs, ids = [], [], [], []
    kept = failed = 0
    for chunk, rows in iter_csv(path, (TIME, PROMPT, OUTPUT), limit=None):
        ok = (pd.to_numeric(chunk[OUTPUT], errors="coerce") != 0).to_numpy()
        if limit is not None and kept + int(ok.sum()) > limit:
            last = int(np.flatnonzero(ok)[limit - kept - 1]) + 1
            chunk, rows, ok = chunk.iloc[:last], rows[:last], ok[:last]
        failed += int((~ok).sum())
        chunk, rows = chunk[ok], rows[ok]
        times.append(as_seconds(chunk[TIME], source=path, field=TIME, rows=rows))
        prompt, output = length_columns(chunk, PROMPT, OUTPUT, source=path, rows=rows)
        prompts.append(prompt)
        outputs.append(output)
        ids.append(rows - 1)
        kept += len(rows)
        if limit is not None and kept >= limit:
            break
    if failed:
        warnings.warn(
            f"{path}: dropped {failed} failed request(s) ({OUTPUT} == 0), kept {kept}",
            DroppedRowsWarning,
            stacklevel=2,
        )
    return pd.DataFrame(
        {
            "request_id": concat(ids, np.int64).astype(str),
            "arrival_s": since_first(concat(times, np.float64)),
            "prompt_tokens": concat(prompts, np.int64),
            "output_tokens": concat(outputs, np.int64),
        },
        copy=False,
    )


FORMAT = TraceFormat(
    name="burstgpt",
    summary="BurstGPT CSV (failed requests with 0 response tokens are dropped)",
    syntaxes=("csv",),
    columns=ALL_COLUMNS,
    read=read,
)

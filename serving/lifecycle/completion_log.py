"""The completion log: every request the gateway saw finish, in the canonical trace schema.

``DIR/completions/part-<first arrival ms>-<n>.parquet``, one row a finished request with
``request_id``, ``arrival_s``, ``prompt_tokens``, ``output_tokens``, ``prompt_key`` (the
canonical columns, what ``balanceroute train --trace DIR/completions`` reads as it is) plus
``worker`` (the rank), ``arm``, ``queue_delay_s`` (the wait in the gateway's pool; the column
names of :mod:`balanceroute.features.columns`), ``finish_s`` and ``finish_reason`` (the rank's:
``length``, ``stop``; a request the rank aborted or that failed is never logged, so the log
holds only whole outputs, what the estimators may learn from), and what the deployed estimator
predicted at admission: ``predicted_p_finish`` (``P(r <= H)``), ``predicted_c``
(``E[min(r, H)]``), ``predicted_horizon`` (``H``), ``model_name``, ``model_version`` (null for an
arm without one; :mod:`balanceroute.predict.live_quality`). Rows are buffered and a part is
written whole, atomically, once the buffer holds about ``rotate_bytes`` or its oldest row is
``rotate_s`` old (10 s, checked every second), and at shutdown: a SIGKILL loses at most the last ``rotate_s`` + 1 s of rows. ``arrival_s`` counts seconds from the log's origin, kept in ``DIR/completions/log.json``
so the parts of several gateway runs into one folder share one clock (the loaders bound arrival
times, so epoch seconds would not do).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pyarrow as pa

from balanceroute.features.errors import UserError
from balanceroute.features.files import write_json
from balanceroute.predict.live_quality import NO_PREDICTION, PREDICTION_COLUMNS

ROW_BYTES = 48  # the fixed columns of one row; keys and ids add their lengths
COLUMNS = ("request_id", "arrival_s", "prompt_tokens", "output_tokens", "prompt_key",
           "worker", "arm", "queue_delay_s", "finish_s", "finish_reason",
           *PREDICTION_COLUMNS)  # fmt: skip
# fmt: off
TYPES = {"finish_reason": pa.string(), "predicted_p_finish": pa.float64(),  # may be all null
         "predicted_c": pa.float64(), "predicted_horizon": pa.int64(), "model_name": pa.string(),
         "model_version": pa.string()}
# fmt: on


class CompletionLog:
    """Buffered rows, written as Parquet parts (``folder`` None: nothing is kept)."""

    def __init__(self, folder: str | Path | None, rotate_bytes: int, rotate_s: float) -> None:
        self.folder = None if folder is None else Path(folder)
        self.rotate_bytes = rotate_bytes
        self.rotate_s = rotate_s
        self.rows: dict[str, list[Any]] = {c: [] for c in COLUMNS}
        self.bytes = 0
        self.oldest: float | None = None
        self.parts = 0
        self.written = 0
        self.origin = time.time()
        if self.folder is not None:
            self.origin = self._origin()

    def _origin(self) -> float:
        assert self.folder is not None
        meta = self.folder / "log.json"
        if meta.exists():
            try:
                return float(json.loads(meta.read_text())["origin_epoch_s"])
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise UserError(f"cannot read '{meta}': {exc}") from None
        write_json(meta, {"origin_epoch_s": self.origin, "schema": list(COLUMNS)})
        return self.origin

    def add(
        self,
        request_id: str,
        arrival_epoch_s: float,
        prompt_tokens: int,
        output_tokens: int,
        prompt_key: str,
        rank: int,
        arm: str,
        queue_s: float,
        finish_epoch_s: float,
        finish_reason: str | None = None,
        prediction: tuple[Any, ...] = NO_PREDICTION,
    ) -> None:
        """One finished request (``queue_s``: its wait in the gateway's pool; ``prediction``:
        the values of the prediction columns)."""
        if self.folder is None:
            return
        values = (request_id, arrival_epoch_s - self.origin, prompt_tokens, output_tokens,
                  prompt_key, rank, arm, queue_s, finish_epoch_s - self.origin,
                  finish_reason, *prediction)  # fmt: skip
        for name, value in zip(COLUMNS, values, strict=True):
            self.rows[name].append(value)
        self.bytes += ROW_BYTES + len(request_id) + len(prompt_key) + len(arm)
        if self.oldest is None:
            self.oldest = time.monotonic()

    def due(self) -> bool:
        """Whether the buffer should become a part now (size or age)."""
        if self.oldest is None:
            return False
        return self.bytes >= self.rotate_bytes or time.monotonic() - self.oldest >= self.rotate_s

    def take(self) -> tuple[Path, pa.Table] | None:
        """The buffered rows as a table and the part's path (buffer reset); None if empty."""
        if self.folder is None or not self.rows["request_id"]:
            return None
        rows, self.rows = self.rows, {c: [] for c in COLUMNS}
        self.bytes, self.oldest = 0, None
        first_ms = int((self.origin + min(rows["arrival_s"])) * 1e3)
        path = self.folder / f"part-{first_ms:013d}-{self.parts:05d}.parquet"
        self.parts += 1
        self.written += len(rows["request_id"])
        columns = {k: pa.array(v, TYPES[k]) if k in TYPES else v for k, v in rows.items()}
        return path, pa.table(columns)

"""The simulator's per-iteration records: worker-load rows, reduced a chunk at a time."""

from __future__ import annotations

import numpy as np


class Recorder:
    """Per-iteration records, kept as a buffer of worker-load rows reduced a chunk at a time."""

    CHUNK = 4096

    def __init__(self, workers: int, record_loads: bool) -> None:
        self.workers = workers
        self.record_loads = record_loads
        self.buf = np.empty((self.CHUNK, workers))
        self.wait = np.empty(self.CHUNK, dtype=np.int64)
        self.start = np.empty(self.CHUNK)
        self.j = 0
        self.parts: dict[str, list[np.ndarray]] = {
            "imb": [],
            "mx": [],
            "tot": [],
            "wait": [],
            "start": [],
            "loads": [],
        }

    def flush(self) -> None:
        """Reduce the buffered rows into the parts."""
        j = self.j
        if j == 0:
            return
        rows = self.buf[:j]
        mx = rows.max(axis=1)
        tot = rows.sum(axis=1)
        self._append(
            self.workers * mx - tot,
            mx,
            tot,
            self.wait[:j].copy(),
            self.start[:j].copy(),
            rows.copy() if self.record_loads else None,
        )
        self.j = 0

    def _append(self, imb, mx, tot, wait, start, loads) -> None:
        p = self.parts
        p["imb"].append(imb)
        p["mx"].append(mx)
        p["tot"].append(tot)
        p["wait"].append(wait)
        p["start"].append(start)
        if loads is not None:
            p["loads"].append(loads)

    def add_span(
        self, path: np.ndarray, mx: np.ndarray, wait: np.ndarray, start: np.ndarray
    ) -> None:
        """Record a whole span of iterations computed at once."""
        self.flush()
        tot = path.sum(axis=1)
        self._append(
            self.workers * mx - tot, mx, tot, wait, start, path if self.record_loads else None
        )

    def result(self, end_time: float) -> dict[str, np.ndarray | None]:
        """Every record, concatenated; ``start`` ends with ``end_time``."""
        self.flush()
        p = self.parts
        cat = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in p.items() if k != "loads"}
        cat["wait"] = cat["wait"].astype(np.int64)
        cat["start"] = np.concatenate((cat["start"], [end_time]))
        cat["loads"] = (
            (np.concatenate(p["loads"]) if p["loads"] else np.zeros((0, self.workers)))
            if self.record_loads
            else None
        )
        return cat

"""The pipeline's input: the recent window of a completion log, and its lineage.

A completion log is the folder a gateway writes (``OUT/completions``: Parquet parts and
``log.json`` with the clock's origin, :mod:`balanceroute.serving.lifecycle.completion_log`) or any
canonical trace file. The window is its last ``rows`` requests in arrival order (and, with
``max_age_s``, only those that arrived within that many seconds of the last one). Its lineage
(which log, which rows, which code) goes to MLflow with every version the cycle registers, as
``pipeline.*`` tags; the champion's ``pipeline.window_end_epoch_s`` tells the next cycle which
rows it has not seen.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.digest import frame_sha256
from balanceroute.features.errors import UserError
from balanceroute.features.loaders import PART_SUFFIXES, load_trace

WINDOW_END_TAG = "pipeline.window_end_epoch_s"


@dataclass(frozen=True)
class LogWindow:
    """The recent requests of a completion log, in arrival order, and where they came from."""

    frame: pd.DataFrame
    origin_epoch_s: float  # the log's clock: arrival_s counts from here
    log_rows: int
    path: Path

    @property
    def end_epoch_s(self) -> float:
        """When the window's last request arrived, on the wall clock."""
        return self.origin_epoch_s + float(self.frame["arrival_s"].iloc[-1])

    def new_rows(self, after_epoch_s: float | None) -> int:
        """Requests of the window that arrived after ``after_epoch_s`` (all when None)."""
        if after_epoch_s is None:
            return len(self.frame)
        arrival = self.origin_epoch_s + self.frame["arrival_s"].to_numpy(dtype=np.float64)
        return int(np.count_nonzero(arrival > after_epoch_s))

    def source(self) -> dict[str, Any]:
        """The description ``train`` records of its input."""
        return {
            "kind": "completion-log",
            "path": str(self.path),
            "rows": len(self.frame),
            "sha256": frame_sha256(self.frame),
        }

    def lineage(self) -> dict[str, str]:
        """``pipeline.*`` tags: the log, the window's rows and the code that fitted them."""
        f = self.frame
        return {
            "pipeline.log": str(self.path),
            "pipeline.log_rows": str(self.log_rows),
            "pipeline.log_origin_epoch_s": repr(self.origin_epoch_s),
            "pipeline.window_rows": str(len(f)),
            "pipeline.window_first_arrival_s": repr(float(f["arrival_s"].iloc[0])),
            "pipeline.window_last_arrival_s": repr(float(f["arrival_s"].iloc[-1])),
            "pipeline.window_first_request_id": str(f["request_id"].iloc[0]),
            "pipeline.window_last_request_id": str(f["request_id"].iloc[-1]),
            "pipeline.window_sha256": frame_sha256(f),
            WINDOW_END_TAG: repr(self.end_epoch_s),
            "pipeline.code_version": code_version(),
        }


def log_origin(path: Path) -> float:
    """The epoch second a gateway's completion log counts arrivals from (0 for a plain trace)."""
    meta = path / "log.json" if path.is_dir() else None
    if meta is None or not meta.exists():
        return 0.0
    try:
        return float(json.loads(meta.read_text())["origin_epoch_s"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"cannot read the completion log's clock '{meta}': {exc}") from None


def not_started(path: str | Path) -> bool:
    """Whether ``path`` is a gateway's completion log with its clock but no part written yet (a
    gateway that just started: nothing to learn from yet, not an error)."""
    folder = Path(path)
    if not (folder / "log.json").is_file():
        return False
    return not any(p.suffix in PART_SUFFIXES for p in folder.iterdir() if p.is_file())


def read_window(path: str | Path, rows: int, max_age_s: float | None = None) -> LogWindow:
    """The last ``rows`` requests of the log at ``path`` (within ``max_age_s`` of the last
    arrival, if given); a UserError naming the log when it cannot be read or is empty."""
    if rows < 1:
        raise UserError(f"the window must hold at least 1 request, got {rows}")
    where = Path(path).resolve()
    if not where.exists():
        raise UserError(f"completion log '{where}' does not exist")
    frame = load_trace(where)
    if frame.empty:
        raise UserError(f"completion log '{where}' holds no requests")
    frame = frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    window = frame.iloc[-rows:]
    if max_age_s is not None:
        last = float(window["arrival_s"].iloc[-1])
        window = window[window["arrival_s"] >= last - max_age_s]
    return LogWindow(window.reset_index(drop=True), log_origin(where), len(frame), where)


def code_version() -> str:
    """The package version and, in a git checkout, its commit (``+dirty`` with local edits)."""
    version = importlib.metadata.version("balanceroute")
    here = Path(__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return version
    return f"{version}+git.{commit}{'.dirty' if dirty else ''}"

"""The emulator's ground truth on disk: one row per iteration and one per request (Parquet).

``DIR/iterations/part-NNNNN.parquet``: ``iteration``, ``start_s`` (wall, when admission ran),
``model_start_s`` (the cost model's clock, what the simulator's ``t_start`` is), ``duration_s``
(cost-model duration, unscaled), ``deadline_s`` (scheduled end, wall), ``end_s`` (when the
iteration's tokens were emitted, wall), ``done_s`` (fan-out finished), ``admitted``, ``emitted``,
``finished``, and per rank (fixed-size lists of ``G``) ``loads`` (KV tokens after admission),
``running``, ``waiting`` and ``prefill`` (prompt tokens computed; 0 without a prefill term). Wall times are seconds since the group started (``config.json``
holds the epoch). ``DIR/requests/part-NNNNN.parquet``: one row per request the group accepted,
written when both the group and the HTTP handler are done with it (columns in
:data:`REQUEST_COLUMNS`). Parts are written atomically (temp file, then rename) every
:attr:`IterationLog.CHUNK` rows and at shutdown; read them back with :func:`read_log`.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from balanceroute.features.columns import canonical_columns
from balanceroute.features.errors import UserError

SCALAR_COLUMNS = (
    ("iteration", np.int64),
    ("start_s", np.float64),
    ("model_start_s", np.float64),
    ("duration_s", np.float64),
    ("deadline_s", np.float64),
    ("end_s", np.float64),
    ("done_s", np.float64),
    ("admitted", np.int64),
    ("emitted", np.int64),
    ("finished", np.int64),
)
RANK_COLUMNS = ("loads", "running", "waiting", "prefill")
REQUEST_COLUMNS = (
    "seq",
    "request_id",
    "worker",
    "endpoint",
    "stream",
    "prompt_tokens",
    "max_tokens",
    "target_tokens",
    "generated",
    "finish_reason",
    "arrival_iter",
    "admit_iteration",
    "recv_s",
    "admit_s",
    "first_token_s",
    "first_sent_s",
    "finish_s",
)


class IterationLog:
    """Per-iteration rows in preallocated numpy buffers, flushed to Parquet parts by chunk.

    Without a directory the rows are still kept for the last chunk (cheap), then dropped.
    """

    CHUNK = 4096

    def __init__(self, directory: str | Path | None, ranks: int) -> None:
        self.dir = None if directory is None else Path(directory)
        self.ranks = ranks
        self.cols = {name: np.zeros(self.CHUNK, dtype=dt) for name, dt in SCALAR_COLUMNS}
        self.per_rank = {
            name: np.zeros((self.CHUNK, ranks), dtype=np.int64) for name in RANK_COLUMNS
        }
        self.j = 0
        self.parts = 0
        self.req_parts = 0
        self.requests: list[tuple] = []
        if self.dir is not None:
            if any(self.dir.glob("*/part-*.parquet")):
                raise UserError(
                    f"log folder {self.dir} already holds a run's logs; give a new or empty one"
                )
            (self.dir / "iterations").mkdir(parents=True, exist_ok=True)
            (self.dir / "requests").mkdir(parents=True, exist_ok=True)

    def full(self) -> bool:
        """True when the buffers hold a whole chunk (call :meth:`take` then)."""
        return self.j == self.CHUNK

    def take(self) -> pa.Table | None:
        """The buffered iteration rows as a table (buffers reset); None when empty."""
        j = self.j
        self.j = 0
        if j == 0 or self.dir is None:
            return None
        # copies: the table is written in a thread while the next rows fill these buffers
        arrays = {name: pa.array(col[:j].copy()) for name, col in self.cols.items()}
        for name, mat in self.per_rank.items():
            flat = pa.array(mat[:j].flatten())
            arrays[name] = pa.FixedSizeListArray.from_arrays(flat, self.ranks)
        return pa.table(arrays)

    def add_request(self, row: tuple) -> None:
        """Keep one finished request's record (see :data:`REQUEST_COLUMNS`)."""
        if self.dir is not None:
            self.requests.append(row)

    def take_requests(self) -> pa.Table | None:
        """The buffered request rows as a table (buffer reset); None when empty."""
        rows, self.requests = self.requests, []
        if not rows or self.dir is None:
            return None
        frame = pd.DataFrame.from_records(rows, columns=list(REQUEST_COLUMNS))
        return pa.Table.from_pandas(frame, preserve_index=False)

    def iteration_path(self) -> Path:
        """The next iteration part's file name (numbered on the event loop, written anywhere)."""
        assert self.dir is not None
        self.parts += 1
        return self.dir / "iterations" / f"part-{self.parts - 1:05d}.parquet"

    def request_path(self) -> Path:
        """The next request part's file name."""
        assert self.dir is not None
        self.req_parts += 1
        return self.dir / "requests" / f"part-{self.req_parts - 1:05d}.parquet"


def read_log(directory: str | Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The iteration log (sorted by iteration) and the request log (sorted by ``seq``)."""
    base = Path(directory)
    frames = []
    for sub, key in (("iterations", "iteration"), ("requests", "seq")):
        parts = sorted((base / sub).glob("part-*.parquet"))
        if parts:
            frame = pd.concat([pd.read_parquet(p) for p in parts], ignore_index=True)
            frame = canonical_columns(frame)  # logs written with the old column names too
            frame = frame.sort_values(key, kind="stable").reset_index(drop=True)
        else:
            frame = pd.DataFrame(
                columns=[c for c, _ in SCALAR_COLUMNS]
                if sub == "iterations"
                else list(REQUEST_COLUMNS)
            )
        frames.append(frame)
    return frames[0], frames[1]


def rank_matrix(iterations: pd.DataFrame, column: str) -> np.ndarray:
    """A per-rank list column as an ``(iterations, G)`` int64 matrix."""
    if len(iterations) == 0:
        return np.zeros((0, 0), dtype=np.int64)
    return np.stack(iterations[column].to_numpy()).astype(np.int64)


def loads_at(iterations: pd.DataFrame, requests: pd.DataFrame, times: np.ndarray,
             ranks: int, since: str = "admit_s") -> np.ndarray:  # fmt: skip
    """The engine's per-rank KV loads at arbitrary wall ``times`` (seconds since the group
    started, as the log's): every request counted from ``since`` (``admit_s``: its admission;
    ``recv_s``: its arrival at the rank) until its ``finish_s``, with its prompt and the tokens
    its rank emitted by then (one per iteration end from its admission on). What a router
    watching the group would ideally see, to check a live router's view against; ``(T, G)``."""
    times = np.asarray(times, dtype=np.float64)
    out = np.zeros((times.shape[0], ranks), dtype=np.float64)
    ran = requests[requests["admit_iteration"].to_numpy() >= 0]
    if ran.empty or times.size == 0:
        return out
    order = np.argsort(iterations["iteration"].to_numpy())
    numbers = iterations["iteration"].to_numpy()[order]
    ends = iterations["end_s"].to_numpy()[order]
    emitted = np.searchsorted(ends, times, side="right")  # iteration ends up to each time
    first = np.searchsorted(numbers, ran["admit_iteration"].to_numpy())
    begin = ran[since].to_numpy(dtype=np.float64)
    finish = ran["finish_s"].to_numpy(dtype=np.float64)
    prompt = ran["prompt_tokens"].to_numpy(dtype=np.float64)
    made = ran["generated"].to_numpy(dtype=np.float64)
    worker = ran["worker"].to_numpy(dtype=np.int64)
    for lo in range(0, times.shape[0], 512):  # (times x requests) in slices
        t = times[lo : lo + 512, None]
        live = (begin[None, :] <= t) & (t < finish[None, :])
        tokens = np.clip(emitted[lo : lo + 512, None] - first[None, :], 0, made[None, :])
        work = np.where(live, prompt[None, :] + tokens, 0.0)
        for g in range(ranks):
            out[lo : lo + 512, g] = work[:, worker == g].sum(axis=1)
    return out

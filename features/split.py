"""Time-ordered split of a trace: the earlier part trains, the later part is tested or replayed."""

from __future__ import annotations

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError


def time_split(
    trace: pd.DataFrame,
    fraction: float,
    *,
    min_head: int = 1,
    min_tail: int = 1,
    rebase_tail: bool = False,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The earlier ``fraction`` of requests (by arrival) and the rest.

    ``rebase_tail`` restarts the later part's arrival times at 0, for replaying it on its own.
    """
    if not 0.0 < fraction < 1.0:
        raise UserError(f"split fraction must be in (0, 1), got {fraction}")
    n = len(trace)
    cut = round(n * fraction)
    if cut < min_head or n - cut < min_tail:
        raise UserError(
            f"trace too short to split: {n} requests give {cut} earlier and {n - cut} later; "
            f"need at least {min_head} and {min_tail}"
        )
    order = np.argsort(trace["arrival_s"].to_numpy(), kind="stable")
    ordered = trace.iloc[order].reset_index(drop=True)
    head = ordered.iloc[:cut].reset_index(drop=True)
    tail = ordered.iloc[cut:].reset_index(drop=True)
    if rebase_tail:
        tail["arrival_s"] = tail["arrival_s"] - tail["arrival_s"].iloc[0]
    return head, tail

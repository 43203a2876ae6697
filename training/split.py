"""Time-ordered train/test split of a canonical trace, with the checks that make it meaningful."""

from __future__ import annotations

import numpy as np
import pandas as pd

from features.errors import UserError

MIN_TRAIN = 50
MIN_TEST = 20


def time_split(
    trace: pd.DataFrame, train_fraction: float = 0.7
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Earlier ``train_fraction`` of requests (by arrival) to train, the rest to validate."""
    if not 0.0 < train_fraction < 1.0:
        raise UserError(f"train fraction must be in (0, 1), got {train_fraction}")
    n = len(trace)
    n_train = round(n * train_fraction)
    if n_train < MIN_TRAIN or n - n_train < MIN_TEST:
        raise UserError(
            f"trace too short to split: {n} requests give {n_train} to train and "
            f"{n - n_train} to validate; need at least {MIN_TRAIN} and {MIN_TEST}"
        )
    out = trace["output_tokens"].to_numpy()
    if np.unique(out).size < 2:
        raise UserError(
            f"all {n} requests have the same output length ({int(out[0])}): "
            "there is nothing to predict"
        )
    order = np.argsort(trace["arrival_s"].to_numpy(), kind="stable")
    ordered = trace.iloc[order].reset_index(drop=True)
    return ordered.iloc[:n_train].reset_index(drop=True), ordered.iloc[n_train:].reset_index(
        drop=True
    )

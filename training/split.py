"""Time-ordered train/validation split, with the checks that make training meaningful."""

from __future__ import annotations

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.split import time_split as split_by_time

MIN_TRAIN = 50
MIN_TEST = 20


def time_split(
    trace: pd.DataFrame, train_fraction: float = 0.7
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Earlier ``train_fraction`` of requests (by arrival) to train, the rest to validate."""
    train, test = split_by_time(trace, train_fraction, min_head=MIN_TRAIN, min_tail=MIN_TEST)
    out = trace["output_tokens"].to_numpy()
    if np.unique(out).size < 2:
        raise UserError(
            f"all {len(trace)} requests have the same output length ({int(out[0])}): "
            "there is nothing to predict"
        )
    return train, test

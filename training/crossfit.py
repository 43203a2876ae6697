"""Cross-fitting for the twin's prior: every request of the history is replayed by a copy of the
estimator that was fitted without it, so the prior's evidence covers the whole history.

The history is cut into ``K`` contiguous folds in arrival order; fold ``j``'s copy is fitted on
the other folds (earlier and later ones) and replays fold ``j`` only. ``K = 1`` is the older
scheme: one copy fitted on the training part, replaying the holdout after it.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator

DEFAULT_PRIOR_FOLDS = 2
MAX_FOLDS = 16


def time_folds(frame: pd.DataFrame, k: int) -> list[tuple[pd.DataFrame, pd.DataFrame]]:
    """``k`` contiguous folds of ``frame`` in arrival order, each as ``(the other folds, to fit
    on; the fold, to replay)``; the folds partition the requests."""
    if not 2 <= k <= MAX_FOLDS:
        raise UserError(f"twin prior folds must be in 2..{MAX_FOLDS}, got {k}")
    if len(frame) < 2 * k:
        raise UserError(f"{len(frame)} requests are too few for {k} twin prior folds")
    order = np.argsort(frame["arrival_s"].to_numpy(), kind="stable")
    ordered = frame.iloc[order].reset_index(drop=True)
    bounds = np.linspace(0, len(ordered), k + 1).round().astype(int)
    folds = []
    for lo, hi in itertools.pairwise(bounds):
        replay = ordered.iloc[lo:hi].reset_index(drop=True)
        fit = pd.concat([ordered.iloc[:lo], ordered.iloc[hi:]], ignore_index=True)
        folds.append((fit, replay))
    return folds


def fitted_folds(
    fit: Callable[[pd.DataFrame], CompletionEstimator],
    folds: list[tuple[pd.DataFrame, pd.DataFrame]],
) -> list[tuple[CompletionEstimator, pd.DataFrame]]:
    """Each fold's copy, ``fit`` on the requests outside it, beside the requests it replays."""
    return [(fit(train), replay) for train, replay in folds]

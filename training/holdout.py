"""The time-ordered holdout every estimator is scored on: earlier requests train, later ones test.

Test snapshots are a few seeded random ages of each test request, the same for every estimator,
so their scores compare. Splits that would make training meaningless are refused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from balanceroute.features.causal import CausalConfig
from balanceroute.features.errors import UserError
from balanceroute.features.schema import TraceArrays, to_arrays
from balanceroute.features.split import time_split
from balanceroute.predict.base import CompletedBatch, CompletionEstimator

SNAPSHOTS_PER_REQUEST = 3
MIN_TRAIN = 50
MIN_TEST = 20


@dataclass(frozen=True, slots=True)
class Holdout:
    """A trace split in time, with the seeded test snapshots every estimator is scored on."""

    train: pd.DataFrame
    arrays: TraceArrays  # the whole trace, train rows first
    first_test: int
    index: np.ndarray
    age: np.ndarray
    test: pd.DataFrame | None = None  # the later requests, arrival times as in the trace

    @property
    def remaining(self) -> np.ndarray:
        return self.arrays.output_tokens[self.index] - self.age


def holdout_snapshots(
    output_tokens: np.ndarray, first: int, per_request: int = 3, seed: int = 0
) -> tuple[np.ndarray, np.ndarray]:
    """(request index, age) with ``per_request`` ages uniform on ``0..O-1`` for requests >= first."""
    out = np.asarray(output_tokens, dtype=np.int64)
    rng = np.random.default_rng(seed)
    idx = np.repeat(np.arange(first, out.size), per_request)
    age = np.floor(rng.random(idx.size) * out[idx]).astype(np.int64)
    return idx, np.minimum(age, out[idx] - 1)


def make_holdout(trace: pd.DataFrame, train_fraction: float = 0.7, seed: int = 0) -> Holdout:
    """Split ``trace`` in time and draw three snapshots per test request at random ages."""
    train, test = time_split(trace, train_fraction, min_head=MIN_TRAIN, min_tail=MIN_TEST)
    out = trace["output_tokens"].to_numpy()
    if np.unique(out).size < 2:
        raise UserError(
            f"all {len(trace)} requests have the same output length ({int(out[0])}): "
            "there is nothing to predict"
        )
    arrays = to_arrays(pd.concat([train, test], ignore_index=True))
    index, age = holdout_snapshots(arrays.output_tokens, len(train), SNAPSHOTS_PER_REQUEST, seed)
    return Holdout(train, arrays, len(train), index, age, test)


def observe_training_part(
    estimator: CompletionEstimator, holdout: Holdout, cfg: CausalConfig
) -> None:
    """Let a model fitted on other data observe the training requests, in finish order."""
    a = holdout.arrays
    n = holdout.first_test
    finish = cfg.finish_times(a)[:n]
    o = np.argsort(finish, kind="stable")
    estimator.observe(
        CompletedBatch(a.prompt_tokens[o], a.output_tokens[o], a.prompt_key[o], finish[o])
    )

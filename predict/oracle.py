"""Oracle: the true remaining length read from the replayed trace. A reference, never deployable."""

from __future__ import annotations

from typing import Self

import numpy as np
import pandas as pd

from balanceroute.predict.base import (
    CompletionEstimator,
    Fitting,
    Prediction,
    RunningBatch,
    survival_from_remaining,
)


class OracleEstimator(CompletionEstimator):
    """Knows every request's output length; ``fit`` takes the trace that will be replayed."""

    name = "oracle"
    fitting = Fitting.TRACE
    provides_survival = True
    deployable = False
    learns_online = False

    def fit(self, history: pd.DataFrame) -> Self:
        self.output_tokens_ = history["output_tokens"].to_numpy(dtype=np.int64).copy()
        self.fitted_ = True
        return self

    def remaining(self, batch: RunningBatch) -> np.ndarray:
        self.check_fitted()
        if batch.request_index is None:
            raise ValueError("the oracle needs request_index: the rows of the replayed trace")
        return np.maximum(self.output_tokens_[batch.request_index] - batch.age, 1)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        r = self.remaining(batch)
        h = self.horizon
        return Prediction(
            p_finish=(r <= h).astype(np.float64),
            c=np.minimum(r, h).astype(np.float64),
            survival=survival_from_remaining(r, h) if survival else None,
        )

"""``none``: every running request is projected to survive the whole window."""

from __future__ import annotations

from typing import Self

import numpy as np
import pandas as pd

from balanceroute.predict.base import CompletionEstimator, Fitting, Prediction, RunningBatch


class NoPrediction(CompletionEstimator):
    """The same router without prediction is one flag away: ``--estimator none``."""

    name = "none"
    fitting = Fitting.NONE
    provides_survival = True
    learns_online = False

    def fit(self, history: pd.DataFrame | None = None) -> Self:
        self.fitted_ = True
        return self

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        n = batch.size
        h = self.horizon
        return Prediction(
            p_finish=np.zeros(n),
            c=np.full(n, float(h)),
            survival=np.ones((n, h + 1)) if survival else None,
        )

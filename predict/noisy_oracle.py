"""``noisy-oracle``: the true remaining length times log-normal noise. A study tool, not deployable.

It answers "how good must a predictor be?": with ``sigma = 0`` it is the oracle; the noise factor
``exp(sigma * z)`` is drawn per (request, age), so a refresh re-draws it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy.special import ndtri

from balanceroute.predict.base import (
    EstimatorParams,
    Prediction,
    RunningBatch,
    survival_from_remaining,
)
from balanceroute.predict.oracle import OracleEstimator


@dataclass(frozen=True, slots=True)
class NoisyOracleParams(EstimatorParams):
    """The parameters of :class:`NoisyOracleEstimator`."""

    sigma: float = field(default=0.5, metadata={"help": "log-sd of the multiplicative noise"})
    seed: int = field(default=0, metadata={"help": "seed of the noise"})


class NoisyOracleEstimator(OracleEstimator):
    """Oracle remaining length with multiplicative log-normal noise of log-sd ``sigma``."""

    name = "noisy-oracle"
    Params = NoisyOracleParams

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        r = self.remaining(batch).astype(np.float64)
        mix = (batch.request_index.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)) ^ (
            batch.age.astype(np.uint64) + np.uint64(self.seed)
        )
        u = (mix % np.uint64(2**53)).astype(np.float64) / 2.0**53
        z = ndtri(np.clip(u, 1e-12, 1 - 1e-12))
        noisy = np.maximum(1, np.rint(r * np.exp(self.sigma * z))).astype(np.int64)
        h = self.horizon
        return Prediction(
            p_finish=(noisy <= h).astype(np.float64),
            c=np.minimum(noisy, h).astype(np.float64),
            survival=survival_from_remaining(noisy, h) if survival else None,
        )

"""``osl-hint``: NVIDIA Dynamo's load signal, a client's expected output length decayed as it
generates.

Dynamo books each request's expected output length (``osl``, a hint the client may send with
the request) as load and decays it by ``1 - generated / expected``: the request is expected to
have ``max(expected - generated, 0)`` tokens left. As a completion estimator that is a point
prediction of the remaining length, ``r_hat = max(hint - a, 1)`` at age ``a`` (a request known
to be running has at least one token left), so ``p_finish = 1{r_hat <= H}``,
``c = min(r_hat, H)`` and the survival curve is ``1{r_hat > h}``.

**Where the hint comes from.** A trace with an ``output_hint`` column (positive integers, one per
request, e.g. the ``max_tokens`` or expected length a client sent) gives its hints as they are.
Otherwise (the shared traces and the synthetic presets carry none) the hint is modelled as a
client's guess: the true output length times log-normal noise,
``hint = max(1, round(O * exp(sigma * z)))`` with ``z ~ N(0, 1)`` drawn once per request (a
client guesses once, when it sends the request) from ``seed``. The default ``sigma = 1.0``
(a guess within a factor e of the truth two times in three) is the quality section 10 of the
design measured to keep about 85% of the oracle's gain; ``sigma = 0`` is the oracle.

Like ``oracle`` and ``noisy-oracle`` it reads its hints off the replayed trace (``fit`` takes
that trace, predictions name its rows through ``request_index``); it is a stand-in for a
deployment whose clients send hints, so it is not flagged deployable, and BR-H's do-no-harm
guard does not watch it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.predict.base import (
    CompletionEstimator,
    EstimatorParams,
    Fitting,
    Prediction,
    RunningBatch,
    survival_from_remaining,
)

HINT_COLUMN = "output_hint"


@dataclass(frozen=True, slots=True)
class OslHintParams(EstimatorParams):
    """The parameters of :class:`OslHintEstimator`."""

    sigma: float = field(
        default=1.0, metadata={"help": "log-sd of a client's guess of the output length"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the clients' guesses"})

    def __post_init__(self) -> None:
        if not np.isfinite(self.sigma) or self.sigma < 0:
            raise UserError(f"osl-hint: sigma must be a finite number >= 0, got {self.sigma}")


def client_hints(output_tokens: np.ndarray, sigma: float, seed: int) -> np.ndarray:
    """A client's guess of each output length: ``max(1, round(O * exp(sigma * z)))``,
    ``z ~ N(0, 1)`` once per request."""
    out = np.asarray(output_tokens, dtype=np.float64)
    z = np.random.default_rng(seed).standard_normal(out.size)
    return np.maximum(1, np.rint(out * np.exp(sigma * z))).astype(np.int64)


def trace_hints(trace: pd.DataFrame, sigma: float, seed: int) -> np.ndarray:
    """The trace's own ``output_hint`` column when it has one, else :func:`client_hints`."""
    if HINT_COLUMN not in trace.columns:
        return client_hints(trace["output_tokens"].to_numpy(), sigma, seed)
    hints = pd.to_numeric(trace[HINT_COLUMN], errors="coerce").to_numpy(dtype=np.float64)
    bad = ~np.isfinite(hints) | (hints < 1) | (hints != np.floor(hints))
    if bad.any():
        row = int(np.flatnonzero(bad)[0]) + 1
        raise UserError(
            f"osl-hint: column '{HINT_COLUMN}' row {row}: expected a positive integer, "
            f"got {trace[HINT_COLUMN].iloc[row - 1]!r}"
        )
    return hints.astype(np.int64)


class OslHintEstimator(CompletionEstimator):
    """Dynamo-style: the client's expected output length, minus what was generated."""

    name = "osl-hint"
    Params = OslHintParams
    fitting = Fitting.TRACE
    provides_survival = True
    deployable = False
    learns_online = False

    def fit(self, history: pd.DataFrame) -> Self:
        if len(history) == 0:
            raise UserError("osl-hint: cannot fit on an empty trace")
        self.hints_ = trace_hints(history, self.sigma, self.seed)
        self.fitted_ = True
        return self

    def remaining(self, batch: RunningBatch) -> np.ndarray:
        """``max(hint - age, 1)`` of each running request."""
        self.check_fitted()
        if batch.request_index is None:
            raise UserError("osl-hint needs request_index: the rows of the replayed trace")
        hint = self.hints_[np.asarray(batch.request_index, dtype=np.int64)]
        return np.maximum(hint - np.asarray(batch.age, dtype=np.int64), 1)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        r = self.remaining(batch)
        h = self.horizon
        return Prediction(
            p_finish=(r <= h).astype(np.float64),
            c=np.minimum(r, h).astype(np.float64),
            survival=survival_from_remaining(r, h) if survival else None,
        )

"""``histogram``: AIBrix's output-length predictor, a sliding-window histogram over
``log2(prompt) x log2(output)``.

AIBrix (its ``SimpleOutputPredictor``) keeps, over a sliding window of finished requests, a
two-dimensional histogram of power-of-two buckets: row ``i = floor(log2(prompt))``, column
``j = floor(log2(output))``. For a new request it draws one output length from its prompt row.
Here the estimator answers with the distribution that draw is made from rather than a single
draw (a draw is that distribution plus noise, so the distribution is the stronger baseline for a
load projection):

- the request's prompt row, once it holds at least ``min_count`` completions, else the
  histogram's column sums (every prompt size together);
- within an output bucket ``[2^j, 2^(j+1))`` the length is uniform on its integers, so the
  survival of bucket ``j`` at ``x`` is ``clip((2^(j+1) - 1 - x) / 2^j, 0, 1)``;
- a running request of age ``a`` is conditioned on ``O > a``:
  ``P(r > h) = P(O > a + h) / P(O > a)``; when its row has no mass above ``a`` the column sums
  answer, and when they have none either the request is projected to survive the window (as
  ``none`` projects it: nothing observed says when it ends).

``observe()`` slides the window (O(batch)); ``predict`` is O(n * (H + 1) * buckets).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.limits import input_limits
from balanceroute.features.windows import SlidingWindow
from balanceroute.predict.base import (
    CompletedBatch,
    CompletionEstimator,
    EstimatorParams,
    Prediction,
    RunningBatch,
    from_survival,
)
from balanceroute.predict.survival import history_in_finish_order

DEFAULT_WINDOW = 4096


@dataclass(frozen=True, slots=True)
class HistogramParams(EstimatorParams):
    """The parameters of :class:`HistogramEstimator`."""

    window: int = field(default=DEFAULT_WINDOW, metadata={"help": "completions in the window"})
    min_count: int = field(
        default=8, metadata={"help": "completions a prompt row needs before it answers alone"}
    )
    assumed_tpot_s: float = field(
        default=0.06, metadata={"help": "seconds per decode step of the trace timing model"}
    )

    def __post_init__(self) -> None:
        if self.window < 1 or self.min_count < 1:
            raise UserError(
                f"histogram: window and min_count must be at least 1, got {self.window} "
                f"and {self.min_count}"
            )


def log2_bucket(values: np.ndarray, buckets: int) -> np.ndarray:
    """``floor(log2(v))`` of positive integers, clipped to ``0..buckets-1``."""
    v = np.maximum(np.asarray(values, dtype=np.int64), 1)
    return np.minimum(np.floor(np.log2(v)).astype(np.int64), buckets - 1)


def bucket_survival(x: np.ndarray, buckets: int) -> np.ndarray:
    """``P(O > x | O uniform on the integers of [2^j, 2^(j+1)))`` for every bucket ``j``:
    shape ``x.shape + (buckets,)``."""
    lo = 2.0 ** np.arange(buckets)
    return np.clip((2.0 * lo - 1.0 - np.asarray(x, dtype=np.float64)[..., None]) / lo, 0.0, 1.0)


def _buckets(most: int) -> int:
    return int(np.floor(np.log2(most))) + 1


class HistogramEstimator(CompletionEstimator):
    """AIBrix-style sliding-window histogram over log2(prompt) x log2(output)."""

    name = "histogram"
    Params = HistogramParams
    provides_survival = True
    projection = "expected"

    def fit(self, history: pd.DataFrame) -> Self:
        arrays = history_in_finish_order(history, self.assumed_tpot_s)
        lim = input_limits()
        self.prompt_buckets_ = _buckets(lim.max_prompt_tokens)
        self.output_buckets_ = _buckets(lim.max_output_tokens)
        self.counts_ = np.zeros((self.prompt_buckets_, self.output_buckets_), dtype=np.int64)
        self.window_ = SlidingWindow(self.window)
        self.fitted_ = True
        self.observe(CompletedBatch(arrays.prompt_tokens, arrays.output_tokens, arrays.prompt_key))
        return self

    def observe(self, completions: CompletedBatch) -> None:
        """Slide the window over finished requests (in finish order)."""
        self.check_fitted()
        out = np.asarray(completions.output_tokens, dtype=np.int64)
        if out.size == 0:
            return
        rows = log2_bucket(completions.prompt_tokens, self.prompt_buckets_).astype(np.uint64)
        ev_rows, ev_out, keep = self.window_.push(rows, out)
        cols = self.output_buckets_
        np.subtract.at(self.counts_, (ev_rows.astype(np.int64), log2_bucket(ev_out, cols)), 1)
        np.add.at(self.counts_, (rows[keep].astype(np.int64), log2_bucket(out[keep], cols)), 1)

    def _conditional(self, weights: np.ndarray, age: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``P(O > a + h) / P(O > a)`` for ``h = 0..H`` under bucket weights ``(n, Q)``, and
        whether ``P(O > a) > 0``."""
        hs = np.arange(self.horizon + 1)
        tail = np.einsum(
            "nhq,nq->nh", bucket_survival(age[:, None] + hs, weights.shape[1]), weights
        )
        alive = tail[:, 0] > 1e-12
        curves = tail / np.where(alive, tail[:, 0], 1.0)[:, None]
        return np.minimum.accumulate(np.clip(curves, 0.0, 1.0), axis=1), alive

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        age = np.asarray(batch.age, dtype=np.int64)
        rows = self.counts_[log2_bucket(batch.prompt_tokens, self.prompt_buckets_)]
        pooled = self.counts_.sum(axis=0).astype(np.float64)
        own = rows.sum(axis=1) >= self.min_count
        weights = np.where(own[:, None], rows, pooled[None, :]).astype(np.float64)
        curves, alive = self._conditional(weights, age)
        if pooled.sum() > 0 and not alive.all():
            back, ok = self._conditional(np.broadcast_to(pooled, (age.size, pooled.size)), age)
            curves = np.where(alive[:, None], curves, np.where(ok[:, None], back, 1.0))
        else:
            curves[~alive] = 1.0
        curves[:, 0] = 1.0
        pred = from_survival(curves)
        return pred if survival else Prediction(pred.p_finish, pred.c)

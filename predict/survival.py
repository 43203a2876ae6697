"""``survival``: the marginal empirical CDF of output lengths over a sliding window.

``p_finish = (F(a+H) - F(a)) / (1 - F(a))`` and ``c`` from precomputed cumulative survival sums:
O(1) a request (two array lookups each). ``observe()`` pushes completions into a ring buffer of the
last ``window`` outputs and adjusts a length histogram by +1/-1 (O(batch)); the survival and
cumulative arrays are rebuilt lazily, once, at the next ``predict`` (O(max length)). See
:mod:`balanceroute.features.blend` for the rule when a request outlives every observed length.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd

from balanceroute.features.causal import CausalConfig
from balanceroute.features.errors import UserError
from balanceroute.features.schema import TraceArrays, to_arrays
from balanceroute.features.windows import MarginalCounts, SlidingWindow
from balanceroute.predict.base import (
    CompletedBatch,
    CompletionEstimator,
    EstimatorParams,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.empirical import conditional_prediction

DEFAULT_WINDOW = 131_072


@dataclass(frozen=True, slots=True)
class SurvivalParams(EstimatorParams):
    """The parameters of :class:`SurvivalEstimator`."""

    window: int = field(default=DEFAULT_WINDOW, metadata={"help": "completions in the window"})
    assumed_tpot_s: float = field(
        default=0.06, metadata={"help": "seconds per decode step of the trace timing model"}
    )


def history_in_finish_order(history: pd.DataFrame, assumed_tpot_s: float) -> TraceArrays:
    """A trace's requests ordered by estimated finish time: the order ``observe()`` sees them."""
    if len(history) == 0:
        raise UserError("cannot fit an estimator on an empty history")
    arrays = to_arrays(history)
    finish = CausalConfig(assumed_tpot_s=assumed_tpot_s).finish_times(arrays)
    o = np.argsort(finish, kind="stable")
    return TraceArrays(
        arrays.arrival_s[o], arrays.prompt_tokens[o], arrays.output_tokens[o], arrays.prompt_key[o]
    )


class SurvivalEstimator(CompletionEstimator):
    """Marginal empirical survival of output lengths; the key is ignored."""

    name = "survival"
    Params = SurvivalParams
    provides_survival = True
    projection = "expected"

    def _keys(self, prompt_tokens: np.ndarray, prompt_key: np.ndarray | None) -> np.ndarray:
        return np.zeros(prompt_tokens.shape[0], dtype=np.uint64)

    def _prepare(self, arrays: TraceArrays) -> None:
        """Hook for subclasses: learn anything needed before the window is filled."""

    def fit(self, history: pd.DataFrame) -> Self:
        arrays = history_in_finish_order(history, self.assumed_tpot_s)
        self._prepare(arrays)
        self.window_ = SlidingWindow(self.window)
        self.marginal_ = MarginalCounts()
        self.fitted_ = True
        self.observe(CompletedBatch(arrays.prompt_tokens, arrays.output_tokens, arrays.prompt_key))
        return self

    def observe(self, completions: CompletedBatch) -> None:
        """Slide the window over finished requests (in finish order)."""
        self.check_fitted()
        out = np.asarray(completions.output_tokens, dtype=np.int64)
        if out.size == 0:
            return
        keys = self._keys(np.asarray(completions.prompt_tokens), completions.prompt_key)
        ev_k, ev_o, keep = self.window_.push(keys, out)
        self.marginal_.add(ev_o, -1)
        self.marginal_.add(out[keep], 1)
        self._slide(ev_k, ev_o, keys[keep], out[keep])

    def _slide(self, ev_k: np.ndarray, ev_o: np.ndarray, k: np.ndarray, o: np.ndarray) -> None:
        """Hook for subclasses keeping per-key state."""

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        return conditional_prediction(
            self.marginal_, np.asarray(batch.age), self.horizon, survival=survival
        )

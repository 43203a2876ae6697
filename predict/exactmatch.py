"""``exactmatch``: per-key empirical CDFs, shrunk toward the marginal by their sample count.

Key sources (:mod:`predict.keys`): ``hash`` (the prompt-key column), ``exact-length``, ``bucket``
(prompt-length quantile buckets fitted on the history). Two ways to combine a key with the marginal:

- ``shrink`` (default): the Dirichlet-process posterior predictive with the marginal as base
  measure and ``prior`` pseudo-observations, i.e. key weight ``n/(n+prior)`` at age 0, and at age
  ``a`` only the key's outputs above ``a`` count, so a key whose history says little about old
  requests hands over to the marginal smoothly;
- ``switch``: the key's own CDF when it has at least ``min_count`` outputs and one above the age,
  else the marginal (the paper's ExactMatch).

Per-key outputs live in one sorted composite array (:class:`predict.empirical.KeyedCounts`):
``observe()`` inserts and deletes by binary search (O(window) memmove, no re-sort) and the
cumulative sums are rebuilt lazily at the next ``predict``; lookups are O(log n) a row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.features.schema import TraceArrays
from balanceroute.predict.base import DEFAULT_HORIZON, Prediction, RunningBatch
from balanceroute.predict.empirical import KeyedCounts, conditional_prediction
from balanceroute.predict.keys import check_key_source, derive_keys, fit_bucket_edges
from balanceroute.predict.registry import register
from balanceroute.predict.survival import DEFAULT_WINDOW, SurvivalEstimator

BLENDS = ("shrink", "switch")


@register
class ExactMatchEstimator(SurvivalEstimator):
    """Per-key empirical survival with a marginal fallback."""

    name = "exactmatch"
    provides_survival = True
    projection = "expected"

    def __init__(
        self,
        *,
        horizon: int = DEFAULT_HORIZON,
        key: str = "hash",
        blend: str = "shrink",
        prior: float = 2.0,
        min_count: int = 1,
        n_buckets: int = 64,
        window: int = DEFAULT_WINDOW,
        assumed_tpot_s: float = 0.06,
    ) -> None:
        super().__init__(horizon=horizon, window=window, assumed_tpot_s=assumed_tpot_s)
        self.key = check_key_source(key)
        if blend not in BLENDS:
            raise UserError(f"unknown blend '{blend}'; known blends: {', '.join(BLENDS)}")
        self.blend = blend
        self.prior = float(prior)
        self.min_count = int(min_count)
        self.n_buckets = int(n_buckets)

    def params(self) -> dict[str, Any]:
        return {
            **super().params(),
            "key": self.key,
            "blend": self.blend,
            "prior": self.prior,
            "min_count": self.min_count,
            "n_buckets": self.n_buckets,
        }

    def _prepare(self, arrays: TraceArrays) -> None:
        self.bucket_edges_ = fit_bucket_edges(arrays.prompt_tokens, self.n_buckets)
        self.keyed_ = KeyedCounts()

    def _keys(self, prompt_tokens: np.ndarray, prompt_key: np.ndarray | None) -> np.ndarray:
        return derive_keys(self.key, prompt_tokens, prompt_key, self.bucket_edges_)

    def _slide(self, ev_k: np.ndarray, ev_o: np.ndarray, k: np.ndarray, o: np.ndarray) -> None:
        self.keyed_.remove(ev_k, ev_o)
        self.keyed_.add(k, o)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        age = np.asarray(batch.age, dtype=np.int64)
        keys = self._keys(np.asarray(batch.prompt_tokens), batch.prompt_key)
        n, s_a, s_b, capped = self.keyed_.query(keys, age, self.horizon)
        usable = n >= max(self.min_count, 1)
        if self.blend == "shrink":
            key_w = usable.astype(np.float64)
            marg_w = self.prior
        else:
            key_w = (usable & (s_a > 0)).astype(np.float64)
            marg_w = 1.0 - key_w
        key_surv = self.keyed_.surv_matrix(keys, age, self.horizon) if survival else None
        return conditional_prediction(
            self.marginal_,
            age,
            self.horizon,
            key_weight=key_w,
            marg_weight=marg_w,
            key_terms=(s_a, s_b, capped),
            key_surv=key_surv,
            survival=survival,
        )

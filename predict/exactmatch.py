"""``exactmatch``: per-key empirical CDFs, shrunk toward the marginal by their sample count.

Key sources (:mod:`balanceroute.features.keys`): ``hash`` (the prompt-key column), ``exact-length``, ``bucket``
(prompt-length quantile buckets fitted on the history). Two ways to combine a key with the marginal:

- ``shrink`` (default): the Dirichlet-process posterior predictive with the marginal as base
  measure and ``prior`` pseudo-observations, i.e. key weight ``n/(n+prior)`` at age 0, and at age
  ``a`` only the key's outputs above ``a`` count, so a key whose history says little about old
  requests hands over to the marginal smoothly;
- ``switch``: the key's own CDF when it has at least ``min_count`` outputs and one above the age,
  else the marginal (the paper's ExactMatch).

Per-key outputs live in one sorted composite array (:class:`balanceroute.features.windows.KeyedCounts`):
``observe()`` inserts and deletes by binary search (O(window) memmove, no re-sort) and the
cumulative sums are rebuilt lazily at the next ``predict``; lookups are O(log n) a row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.features.keys import (
    AUTO_KEY,
    check_key_source,
    derive_keys,
    fit_bucket_edges,
    resolve_key_source,
)
from balanceroute.features.schema import TraceArrays
from balanceroute.features.windows import KeyedCounts
from balanceroute.predict.base import Prediction, RunningBatch
from balanceroute.predict.empirical import conditional_prediction
from balanceroute.predict.survival import SurvivalEstimator, SurvivalParams

BLENDS = ("shrink", "switch")


@dataclass(frozen=True, slots=True)
class ExactMatchParams(SurvivalParams):
    """The parameters of :class:`ExactMatchEstimator`."""

    key: str = field(
        default=AUTO_KEY,
        metadata={"help": "hash | exact-length | bucket | auto (hash when the history has keys)"},
    )
    blend: str = field(default="shrink", metadata={"help": "shrink | switch"})
    prior: float = field(default=2.0, metadata={"help": "marginal pseudo-observations (shrink)"})
    min_count: int = field(default=1, metadata={"help": "outputs a key needs to count"})
    n_buckets: int = field(default=64, metadata={"help": "prompt-length buckets (key=bucket)"})

    def __post_init__(self) -> None:
        if self.key != AUTO_KEY:
            check_key_source(self.key)
        if self.blend not in BLENDS:
            raise UserError(f"unknown blend '{self.blend}'; known blends: {', '.join(BLENDS)}")


class ExactMatchEstimator(SurvivalEstimator):
    """Per-key empirical survival with a marginal fallback."""

    name = "exactmatch"
    Params = ExactMatchParams
    provides_survival = True
    projection = "expected"

    def _prepare(self, arrays: TraceArrays) -> None:
        self.key_ = resolve_key_source(self.key, bool((arrays.prompt_key != 0).any()))
        self.bucket_edges_ = fit_bucket_edges(arrays.prompt_tokens, self.n_buckets)
        self.keyed_ = KeyedCounts()

    def _keys(self, prompt_tokens: np.ndarray, prompt_key: np.ndarray | None) -> np.ndarray:
        return derive_keys(self.key_, prompt_tokens, prompt_key, self.bucket_edges_)

    def upgrade_state(self, state: dict[str, Any]) -> dict[str, Any]:
        """Models saved before ``key_`` existed resolved their key at construction."""
        state.setdefault("key_", state.get("key"))
        return state

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

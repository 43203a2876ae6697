"""Causal features for (request, age) snapshots: only what was knowable at the snapshot time.

One definition, two implementations that must agree value for value: :func:`snapshot_features`
builds features offline from a whole trace (training, evaluation); :class:`OnlineHistory` keeps
bounded state updated by ``observe()`` of finished requests and builds the same features at
predict time (router, HTTP service).

Features (column order :attr:`CausalConfig.feature_names`): prompt size, age, EWMAs of finished
output lengths (half-lives counted in completions), mean and std of the last ``recent`` outputs,
mean of their prompts, completions per second over the last ``rate_window_s`` seconds, and for
each key source (exact prompt length, prompt hash) and each key window (the whole window and
shorter recent ones, since workloads drift): count, mean, std and last output of the same key,
plus mean and last minus age, and the seconds since the key's last completion. Last, the
empirical survival estimators' own answers at the snapshot's age, stacked as features: for the
marginal and each key source, over ``window`` and over the shorter ``cond_windows``, the number of
outputs above the age, the conditional finish probability ``P(r <= H)`` and capped expectation
``E[min(r, H)]``; for each key source also ``exactmatch``'s shrunk estimate. Offline these come
from an as-of Fenwick sweep (:func:`balanceroute.features.asof.asof_key_terms`), online from the
same :class:`~balanceroute.features.windows.KeyedCounts` and
:class:`~balanceroute.features.windows.MarginalCounts` the empirical estimators keep.

Modules: ``config`` (what the features are, the timing model), ``columns`` (numpy definitions of
the columns), ``offline``, ``online`` (with its compiled writers in ``kernels``), ``rows`` (which
snapshots train the learned estimators, and the hazard model's person-period rows), ``periods``
(the hazard model's per-bin features, offline and their numpy definition).
"""

from balanceroute.features.causal.config import CausalConfig
from balanceroute.features.causal.offline import snapshot_features, trace_snapshot_features
from balanceroute.features.causal.online import KeyWindowTable, OnlineHistory
from balanceroute.features.causal.periods import (
    hazard_bins,
    period_design,
    period_rows,
    trace_period_features,
)
from balanceroute.features.causal.rows import person_period_rows, training_rows

__all__ = [
    "CausalConfig",
    "KeyWindowTable",
    "OnlineHistory",
    "hazard_bins",
    "period_design",
    "period_rows",
    "person_period_rows",
    "snapshot_features",
    "trace_period_features",
    "trace_snapshot_features",
    "training_rows",
]

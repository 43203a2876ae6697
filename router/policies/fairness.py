"""BalanceRoute's fairness: the cap that admits overdue requests first, and the age priority that
scores a passed-over request higher (docs/design.md, "The queueing tail")."""

from __future__ import annotations

import numpy as np

from balanceroute.features.stats import small_median
from balanceroute.router.policies.balance_config import BalanceRouteConfig
from balanceroute.router.policies.kernels import age_bonus
from balanceroute.router.policies.state import Pool


def overdue(cfg: BalanceRouteConfig, pool: Pool, cand: np.ndarray) -> np.ndarray:
    """The fairness cap: candidates overtaken too often or waiting too long."""
    caps = ((cfg.max_overtake, pool.overtaken), (cfg.max_wait_iters, pool.waited_iterations),
            (cfg.max_wait_s, pool.waited_seconds))  # fmt: skip
    hits = [read(cand) >= cap for cap, read in caps if cap is not None]
    if not hits:
        return np.zeros(cand.shape[0], dtype=np.bool_)
    return hits[0] if len(hits) == 1 else np.logical_or.reduce(hits)


def age_priority(cfg: BalanceRouteConfig, pool: Pool, cand: np.ndarray, prompts: np.ndarray,
                 weights: np.ndarray) -> np.ndarray:  # fmt: skip
    """The age priority: a candidate's score bonus, one typical waiting prompt (scored as
    filling a margin) per ``age_priority`` later admissions that passed it, counted with
    ``age_late`` only once first-come first-served would have admitted it (passes minus the
    older requests still waiting: the candidates are the pool's head, in order). The pool's
    smallest prompts are the ones passed (a larger prompt that fits fills a margin better), and
    they cost the least to admit early."""
    if cfg.age_priority is None or cand.shape[0] == 0:
        return np.zeros(cand.shape[0])
    typical = small_median(prompts) * float(weights.sum())
    return age_bonus(pool.overtaken(cand), typical / cfg.age_priority, cfg.age_late)

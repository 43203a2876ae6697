"""The twin's say in promotion: is a candidate harmful to the group it would route?

The twin's prior (``router/lab/twin/prior.py``, measured by ``train`` on requests the candidate's
copies never saw) replays BR-H with the candidate blended in at each weight ``w`` against
``w = 0`` (no prediction) on the group's shape. The candidate is **harmful** when the paired test
resolves some weight as worse than no prediction: its mean log ratio minus two standard errors
(the twin's own one-sided bound) is above zero. A candidate the twin merely does not resolve as
better is not harmful: the live twin starts it at ``w = 0`` and routes exactly as ``brh:none``.

This module is the one place the pipeline reaches the twin prior (it is moving into a package of
its own): change the import here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.router.lab.twin.prior import DEFAULT_PRIOR_WINDOWS, PriorConfig, TwinPrior

PRIOR_WINDOWS = DEFAULT_PRIOR_WINDOWS  # windows a prior replays unless told
Z = 2.0  # the twin's one-sided bound, m + 2 se (router/lab/twin/prior.py, PRIOR_LEVEL)


@dataclass(frozen=True)
class TwinVerdict:
    """Whether the twin judges a candidate harmful on a group shape, and why."""

    harmful: bool
    start_weight: float | None
    why: str


def prior_configs(shapes: tuple[tuple[int, int], ...], windows: int) -> tuple[PriorConfig, ...]:
    """The prior measurements of the group shapes ``(G, B)``, saturated, ``windows`` each."""
    return tuple(PriorConfig(workers=g, slots=b, windows=windows) for g, b in shapes)


def twin_verdict(priors: list[dict[str, Any]], workers: int, slots: int) -> TwinVerdict:
    """The verdict on a candidate from its measured priors (plain dicts, as ``train`` keeps
    them) for a ``workers`` x ``slots`` group; a UserError if none was measured for it."""
    parsed = [TwinPrior.from_dict(p, "the candidate") for p in priors]
    fit = [p for p in parsed if p.workers == workers and p.slots == slots]
    if not fit:
        raise UserError(f"no twin prior was measured for the group {workers}x{slots}")
    prior = fit[0]
    worse = [
        (c, m, s)
        for c, m, s in zip(prior.candidates, prior.mean_log_ratio, prior.se, strict=True)
        if c != 0.0 and s > 0.0 and m - Z * s > 0.0
    ]
    if worse:
        c, m, _ = max(worse, key=lambda t: t[1])
        why = (
            f"twin ({prior.group}, {prior.windows} windows): blending it at w = {c:g} is "
            f"resolved worse than no prediction (imbalance x{math.exp(m):.3f})"
        )
        return TwinVerdict(True, prior.start_weight, why)
    why = f"twin ({prior.group}, {prior.windows} windows): not harmful, starts at w = "
    return TwinVerdict(False, prior.start_weight, why + f"{prior.start_weight:g}")

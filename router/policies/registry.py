"""Policy registry: CLI name -> class. Unknown names fail listing the known ones."""

from __future__ import annotations

from balanceroute.features.errors import UserError
from balanceroute.router.policies.balance_route import BR0Policy, BRHPolicy, PaperBRHPolicy
from balanceroute.router.policies.baselines import (
    CountJSQPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
    TokenJSQPolicy,
)
from balanceroute.router.policies.exact import ExactPolicy
from balanceroute.router.policies.policy import Policy

POLICIES: dict[str, type[Policy]] = {
    cls.name: cls
    for cls in (
        RandomPolicy,
        RoundRobinPolicy,
        PowerOfTwoPolicy,
        CountJSQPolicy,
        TokenJSQPolicy,
        BR0Policy,
        BRHPolicy,
        PaperBRHPolicy,
        ExactPolicy,
    )
}
# Offline references a live caller may not ask for, and why.
OFFLINE_ONLY: dict[str, str] = {"exact": "an offline MILP reference, seconds per step"}


def policy_names(*, live: bool = False) -> list[str]:
    """Registered router names (``live``: those a routing service or gateway may run)."""
    return [n for n in POLICIES if not (live and n in OFFLINE_ONLY)]


def policy_class(name: str) -> type[Policy]:
    """The policy class registered as ``name``; unknown names list the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        raise UserError(f"unknown router '{name}'; known routers: {', '.join(POLICIES)}") from None

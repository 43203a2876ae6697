"""The one routing-policy interface and the registry from CLI name to policy class."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.router.state import Admissions, RequestTable, RouterState


@dataclass(frozen=True, slots=True)
class RunContext:
    """Fixed facts of one run, given to a policy before the first decision."""

    workers: int
    slots: int
    requests: RequestTable
    seed: int = 0
    extras: dict[str, Any] = field(default_factory=dict)


class Policy:
    """A routing policy: ``route(state)`` returns the admissions for one step.

    ``route`` must be maximal (admit ``state.admissions_due`` requests), respect free slots and
    never admit a request twice; the simulator checks every decision. Hooks default to nothing.
    """

    name: ClassVar[str] = ""

    def reset(self, ctx: RunContext) -> None:
        """Start a new run (clear per-run state, seed randomness)."""
        self.ctx = ctx

    def route(self, state: RouterState) -> Admissions:  # pragma: no cover - interface
        raise NotImplementedError

    def on_complete(
        self, positions: np.ndarray, output_tokens: np.ndarray, finish_s: float, iteration: int
    ) -> None:
        """Requests that left at the start of ``iteration``; their output lengths are now known."""

    def describe(self) -> dict[str, Any]:
        """Resolved configuration, recorded next to every result."""
        return {"name": self.name}


POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Class decorator: make a policy selectable by its ``name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} has no name")
    POLICIES[cls.name] = cls
    return cls


def _load_all() -> None:
    import balanceroute.router.balance_route
    import balanceroute.router.baselines
    import balanceroute.router.exact  # noqa: F401  (registers exact, the IO_0 reference)


def policy_names() -> list[str]:
    _load_all()
    return list(POLICIES)


def policy_class(name: str) -> type[Policy]:
    """The policy class registered as ``name``; unknown names list the known ones."""
    _load_all()
    try:
        return POLICIES[name]
    except KeyError:
        raise UserError(f"unknown router '{name}'; known routers: {', '.join(POLICIES)}") from None

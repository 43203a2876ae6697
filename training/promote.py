"""Moving the registry's aliases as one change: ``champion`` last, and undone on a failure.

:func:`move_aliases_last_champion` remembers what each alias named before (or that it did not
exist), sets the others first and ``champion`` last, and returns the change; :func:`restore`
puts every alias back. Readers of ``models:/NAME@champion`` see either the old or the new
version, never a version whose checks have not all passed.
"""

from __future__ import annotations

from dataclasses import dataclass

CHAMPION = "champion"


@dataclass(frozen=True)
class AliasChange:
    """The aliases one cycle set and what each named before (None: it did not exist)."""

    model: str
    before: dict[str, str | None]
    after: dict[str, str]


def move_aliases_last_champion(model: str, aliases: dict[str, str]) -> AliasChange:
    """Set ``aliases`` (alias -> version) on ``model``, ``champion`` last; returns the change.
    A failure part-way restores what was set already, then raises."""
    from mlflow import MlflowClient

    client = MlflowClient()
    current = dict(client.get_registered_model(model).aliases)
    order = sorted(aliases, key=lambda a: a == CHAMPION)
    change = AliasChange(model, {a: current.get(a) for a in order}, dict(aliases))
    try:
        for alias in order:
            client.set_registered_model_alias(model, alias, aliases[alias])
    except Exception:
        restore(change)
        raise
    return change


def restore(change: AliasChange) -> None:
    """Put every alias of ``change`` back as it was (``champion`` first)."""
    from mlflow import MlflowClient

    client = MlflowClient()
    for alias in sorted(change.before, key=lambda a: a != CHAMPION):
        old = change.before[alias]
        if old is None:
            client.delete_registered_model_alias(change.model, alias)
        else:
            client.set_registered_model_alias(change.model, alias, old)

"""The one fan-out of finished requests: every arm's model learns each completion exactly once.

The active arm's policy still hears of every departure through ``on_complete`` (it frees the
positions and updates its own state), but its estimator handle is muted (:class:`~.arms.Handle`):
here, and only here, each arm that learns online is taught the completions, whichever arm is
routing, and the ring of recent completions keeps them for the next model reload.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import numpy as np

from balanceroute.predict.base import CompletedBatch
from balanceroute.router.policies.state import RequestTable
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.lifecycle.recent import RecentCompletions

log = logging.getLogger("balanceroute.gateway")


def completed(
    table: RequestTable, positions: np.ndarray, output_tokens: np.ndarray, now: float
) -> CompletedBatch:
    """The completions of ``positions`` (their prompts read before the positions are reused)."""
    return CompletedBatch(
        prompt_tokens=table.prompt_tokens[positions].copy(),
        output_tokens=output_tokens,
        prompt_key=table.prompt_key[positions].copy(),
        time_s=np.full(positions.shape[0], now),
    )


def mute_policies(arms: Iterable[Arm]) -> None:
    """Close the policies' own path to their estimators: the fan-out teaches them."""
    for arm in arms:
        if arm.handle is not None:
            arm.handle.muted = True


def fan_out(
    arms: Iterable[Arm], batch: CompletedBatch, recent: RecentCompletions | None = None
) -> None:
    """Teach ``batch`` to every arm's model that learns online, once, and keep it in ``recent``."""
    if batch.size == 0:
        return
    for arm in arms:
        if arm.handle is None or not arm.handle.learns_online:
            continue
        try:
            arm.handle.learn(batch)
        except Exception:  # one arm's model must not starve the others
            log.exception("arm %s: learning from %d completions failed", arm.label, batch.size)
    if recent is not None:
        recent.add(batch)

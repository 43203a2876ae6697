"""The twin beside a BR-H policy in the simulator (simulate, ab, evaluate)."""

from __future__ import annotations

from typing import Any

import numpy as np

from balanceroute.router.lab.prefill import ReleasedRequests
from balanceroute.router.lab.twin.config import Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.decode import DecodeTwin
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.state import Admissions, RouterState


class TwinDriver(Policy):
    """Runs a :class:`DecodeTwin` beside a BR-H policy in the simulator: completions feed the
    twin, its steps run in the untimed background hook under a budget of ``work_ratio``
    simulated iterations per live iteration, and its weight becomes the policy's blend."""

    def __init__(self, inner: Policy, twin: DecodeTwin, released: ReleasedRequests) -> None:
        self.inner = inner
        self.twin = twin
        self.released = released
        self.name = inner.name
        self.maximal = inner.maximal
        self.credit = 0.0
        self.last_iteration = 0
        self.weight_sum = 0.0
        self.calls = 0
        self.live_iterations = 0

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.inner.set_blend(self.twin.weight)

    def route(self, state: RouterState) -> Admissions:
        self.weight_sum += self.inner.blend
        self.calls += 1
        self.live_iterations = state.iteration
        return self.inner.route(state)

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.inner.on_complete(positions, output_tokens, finish_s, iteration)
        rq = self.released
        n = positions.shape[0]
        self.twin.observe(
            Finished(
                index=np.asarray(positions, dtype=np.int64),
                release_s=rq.release_s[positions],
                prompt_tokens=rq.table.prompt_tokens[positions],
                prompt_key=rq.table.prompt_key[positions],
                trace_index=rq.table.trace_index[positions],
                output_tokens=np.asarray(output_tokens, dtype=np.int64),
                finish_s=np.full(n, float(finish_s)),
            )
        )

    def background(self, iteration: int) -> None:
        self.credit += self.twin.cfg.work_ratio * max(0, iteration - self.last_iteration)
        self.last_iteration = max(self.last_iteration, iteration)
        while self.credit > 0 and self.twin.ready():
            self.credit -= self.twin.step(latest=True)
            self.inner.set_blend(self.twin.weight)

    def run_stats(self) -> dict[str, Any]:
        out = dict(self.inner.run_stats())
        out.update(self.twin.stats())
        out["twin_weight_mean"] = round(self.weight_sum / self.calls, 4) if self.calls else None
        return out

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def twin_managed(policy: Policy) -> bool:
    """Whether ``policy`` takes its blend weight from a twin."""
    return bool(getattr(policy, "twin_managed", False))


def attach_twin(
    policy: Policy,
    group: TwinGroup,
    released: ReleasedRequests,
    config: TwinConfig | None = None,
    warm: SequentialTest | None = None,
) -> Policy:
    """``policy`` driven by a live twin when it is twin-managed, else ``policy`` itself. The
    twin's estimator is a copy of the policy's, taken now (before any request arrived); a
    ``warm`` test (a warm-up on earlier traffic) is where its sequential test starts."""
    if not twin_managed(policy):
        return policy
    twin = DecodeTwin(group, policy.estimator, config, warm=warm)
    return TwinDriver(policy, twin, released)

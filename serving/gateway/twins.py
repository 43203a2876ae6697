"""The gateway's live twins: one per twin-driven arm, and the arms' counterfactual A/B.

Every request's life reaches one feed (:mod:`balanceroute.router.lab.twin.feed`): its arrival
(time at the gateway, prompt tokens, prompt key), its finish with the tokens streamed (the
rows of the completion log), or its drop (abandoned, aborted, failed: never replayed, as the
estimators never learn it). A child process (:class:`~balanceroute.serving.twinproc.process.TwinProcess`:
the replays hold no GIL of the gateway's) numbers the finished requests in arrival order and
steps, under the budget (``work_ratio`` simulated iterations per live iteration, the gateway's
step estimate) and the CPU cap (the child's CPU):

- one :class:`LiveTwin` per arm it drives (BR-H with a learned deployable estimator, the
  ``twin`` option on, no fixed ``blend``): the arm routes at its weight, read at every decision
  (never waited for: the child's last report), ``w = 0`` until the twin has evidence and while
  the child is down;
- with two arms or more, an :class:`ArmComparison`: every arm replayed on the same blocks, the
  switchback's counterfactual (:func:`~balanceroute.router.lab.switchback.twin_agreement`).

The twins copy the arms' models when made (at start and after a reload, on the event loop:
the fan-out updates a model there, never during the copy) and the copies go to the child
pickled (a reload replaces its jobs); their shadows learn only from the feed, leakage-free. The
event loop feeds the child and reads its reports in :meth:`GatewayTwins.tick` (every tick,
never waiting).
"""

from __future__ import annotations

import copy
from typing import Any

from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.remote import RemoteEstimator
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.live import NICE, pending_limit
from balanceroute.router.lab.twin.prior_start import live_start
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.balance_route import BalanceRoutePolicy, guard_applies
from balanceroute.serving.gateway.arms import Arm
from balanceroute.serving.twinproc.child import ComparisonMaker, TwinMaker
from balanceroute.serving.twinproc.process import TwinProcess

COMPARISON = "counterfactual"


def local_model(arm: Arm) -> CompletionEstimator | None:
    """The model an arm predicts with in-process (a prediction service's local fallback)."""
    if arm.handle is None:
        return None
    model = arm.handle.model
    if isinstance(model, RemoteEstimator):
        return model.fallback
    return model


def twin_drives(arm: Arm) -> bool:
    """Whether a live twin chooses this arm's blend weight: BR-H with a learned deployable
    estimator, the ``twin`` option on and no fixed ``blend`` (as ``simulate``'s rule)."""
    policy = arm.policy
    if not isinstance(policy, BalanceRoutePolicy):
        return False
    cfg = policy.config
    return cfg.twin and cfg.blend is None and cfg.horizon > 0 and guard_applies(local_model(arm))


class GatewayTwins:
    """The feed, the twins of the arms and the comparison, in one child process."""

    def __init__(
        self,
        arms: list[Arm],
        ranks: int,
        slots: int,
        *,
        seed: int = 0,
        config: TwinConfig | None = None,
        cost: CostModel | None = None,
        start: float | SequentialTest | None = None,
        enabled: bool = True,
        nice: int = NICE,
    ) -> None:
        self.config = cfg = config or TwinConfig()
        self.enabled = enabled  # off: the driven arms route at their start weight, no replays
        self.cost = cost or CostModel()
        self.ranks, self.slots, self.seed = ranks, slots, seed
        self.start_at = start
        self._starts: dict[str, float | SequentialTest | None] = {}
        self.worker = TwinProcess(cpu_share=cfg.cpu_share, nice=nice)
        self.channel = self.worker.channel("gateway", pending_limit(cfg, ranks, slots))
        self.feed = self.channel.feed
        self.arms = list(arms)
        self.driven = {a.label for a in arms if twin_drives(a)}
        if not self.driven and len(self.arms) < 2:  # nothing to replay or compare, ever (the
            self.enabled = False  # arms are fixed): no twins process at all
        for arm in arms:
            if arm.label in self.driven:
                self.renew(arm)
        if len(arms) > 1 and enabled:
            self._compare()

    # ---- the routing side (event loop) ----------------------------------------------------
    def arrived(self, arrival_s: float, prompt_tokens: int, prompt_key: int) -> int:
        """A request joined the pool; its ticket (-1 with the twins off: nothing is fed)."""
        if not self.enabled:
            return -1
        return self.feed.arrived(arrival_s, prompt_tokens, prompt_key)

    def finished(self, ticket: int, output_tokens: int, now: float) -> None:
        if self.enabled:
            self.feed.finished(ticket, output_tokens, now)

    def dropped(self, ticket: int) -> None:
        if self.enabled:
            self.feed.dropped(ticket)

    def tick(self, iteration: int) -> None:
        """The group's iteration; the child fed and read (every :data:`PUMP_S` at most)."""
        if self.enabled:
            self.feed.tick(iteration)
            self.worker.pump()

    def weight(self, label: str) -> float | None:
        """The weight the arm routes with now (None: no twin drives it; 0 while the twins'
        process is down: no evidence)."""
        if label not in self.driven:
            return None
        if self.worker.down:
            return 0.0
        job = self.channel.job(label)
        return self._start_weight(label) if job is None else job.weight

    def apply(self, arm: Arm) -> None:
        """Before a decision: a driven arm's policy takes its twin's weight."""
        w = self.weight(arm.label)
        if w is not None:
            arm.policy.set_blend(w)

    def renew(self, arm: Arm) -> None:
        """A twin for ``arm`` on its current model (at start, and after a reload changed it:
        the old twin's verdict was about the old model)."""
        if arm.label not in self.driven:
            return
        group = TwinGroup(arm.spec, self.ranks, self.slots, self.cost, self.seed)
        model = copy.deepcopy(local_model(arm))
        cfg, start = self.config, self.start_at
        if start is None:  # the model's prior for this group, if it carries one
            start = live_start(model, self.ranks, self.slots, cfg)
        self._starts[arm.label] = start
        if not self.enabled:
            return
        self.channel.add(arm.label, TwinMaker(group, model, cfg, start))
        if len(self.arms) > 1 and self.channel.job(COMPARISON) is not None:
            self._compare()

    def _compare(self) -> None:
        group = TwinGroup(self.arms[0].spec, self.ranks, self.slots, self.cost, self.seed)
        compared = [
            (a.label, a.spec, copy.deepcopy(local_model(a)),
             self._start_weight(a.label) if a.label in self.driven else None)
            for a in self.arms
        ]  # fmt: skip
        self.channel.add(COMPARISON, ComparisonMaker(compared, group, self.config))

    def _start_weight(self, label: str) -> float:
        s = self._starts.get(label, self.start_at)
        if isinstance(s, SequentialTest):
            return s.weight
        return self.config.start_weight if s is None else float(s)

    # ---- life and status ------------------------------------------------------------------
    def start(self) -> None:
        """Start the twins' process (not with the twins off: no child, nothing fed)."""
        if self.enabled:
            self.worker.start()

    def stop(self) -> None:
        self.worker.stop(timeout_s=10.0)

    def stats(self) -> dict[str, dict[str, Any]]:
        """Per driven arm: weight, blocks judged, switches, CPU seconds, lag in blocks."""
        out = {}
        for label in sorted(self.driven):
            job = self.channel.job(label)
            if job is None:
                w = 0.0 if self.worker.down else self._start_weight(label)
                row: dict[str, Any] = {"twin_weight": w, "twin_decisions": 0,
                                       "twin_switches": 0, "twin_cpu_s": 0.0,
                                       "twin_lag_blocks": 0}  # fmt: skip
            else:
                row = job.stats()
            if label in self.channel.errors:
                row["twin_error"] = self.channel.errors[label]
            out[label] = row
        return out

    def comparison(self) -> dict[str, Any] | None:
        """The counterfactual A/B so far (None with one arm, or before it was made)."""
        job = self.channel.job(COMPARISON)
        return None if job is None else job.summary()

    def feed_stats(self) -> dict[str, Any]:
        """The feed's counts, the twins' process: its CPU (every child so far), passes the cap
        held back, and its state (running, idle with no job, restarting after a death, off after
        too many, stopped; disabled: ``--no-twins``)."""
        return {**self.channel.order.stats(), "worker_cpu_s": round(self.worker.cpu_s, 4),
                "worker_capped_passes": self.worker.capped_passes,
                "twin_process": self.worker.status() if self.enabled else {"state": "disabled"}}  # fmt: skip

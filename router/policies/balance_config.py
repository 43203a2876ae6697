"""The knobs of BR-0 and BR-H, and their presets: one dataclass that drives the policy, the CLI
flags and the service's options model."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from balanceroute.features.constants import DEFAULT_HORIZON, MAX_HORIZON
from balanceroute.features.errors import UserError

PROJECTIONS = ("auto", "cutoff", "expected", "confident")
GAMMA_MIN, GAMMA_MAX = 0.05, 0.995  # docs/design.md, "Short outputs"
PENALTIES = ("sum", "max")
MAX_BETA = 1e6  # overflow penalty: scores stay far inside float64 at the largest loads
MAX_WINDOW = 16_384


def _finite(value: float | None) -> bool:
    return value is None or math.isfinite(value)


@dataclass(frozen=True, slots=True)
class BalanceRouteConfig:
    """Knobs of BR-0/BR-H. ``None`` for ``beta``/``s_greedy`` means ``G`` (number of workers)."""

    horizon: int = field(default=DEFAULT_HORIZON, metadata={"help": "lookahead H in iterations"})
    beta: float | None = field(default=43.0, metadata={"help": "overflow penalty (None = G)"})
    gamma: float = field(
        default=0.9,
        metadata={"help": "discount per lookahead iteration (start value with auto_gamma)"},
    )
    auto_gamma: float | None = field(
        default=1.0,
        metadata={
            "help": "adapt gamma to 1 - X * B / (mean output of finished requests): the chance "
            "that a worker of B slots gets no admission in an iteration"
        },
    )
    r_max: int = field(default=4, metadata={"help": "stage-2 candidate window (subset search)"})
    s_greedy: int | None = field(
        default=0, metadata={"help": "stage 1 runs while free slots exceed this (None = G)"}
    )
    window: int = field(default=32, metadata={"help": "stage-1 candidate window"})
    projection: str = field(
        default="auto",
        metadata={
            "help": "auto (the estimator's own: expected for learned ones) | cutoff | expected "
            "| confident (cutoff only where p_finish >= confidence)"
        },
    )
    confidence: float = field(
        default=0.8, metadata={"help": "p_finish a confident projection needs"}
    )
    refill: bool = field(default=True, metadata={"help": "project freed slots refilled"})
    penalty: str = field(default="sum", metadata={"help": "sum | max over the horizon"})
    refresh: int = field(default=1, metadata={"help": "iterations between predictions"})
    incremental: bool = field(
        default=True,
        metadata={
            "help": "expected projection: predict only requests with no prediction yet or one "
            "repredict iterations old, advance the others' curves by age"
        },
    )
    repredict: int = field(
        default=16, metadata={"help": "iterations after which a running request is re-predicted"}
    )
    predict_every: int = field(
        default=1,
        metadata={
            "help": "incremental projection: iterations between estimator calls (the curves "
            "are advanced every iteration; completions reach the estimator before each call)"
        },
    )
    max_overtake: int | None = field(
        default=1024, metadata={"help": "admit first once this many later requests passed"}
    )
    age_priority: float | None = field(
        default=6.0,
        metadata={
            "help": "age priority: a waiting request's score gains one typical waiting prompt "
            "(as scored filling a margin) for every this many later admissions that passed it "
            "(None: off); with age_late, only admissions after first-come first-served would "
            "have admitted it count"
        },
    )
    max_wait_s: float | None = field(
        default=None, metadata={"help": "admit first after waiting this many seconds"}
    )
    max_wait_iters: int | None = field(
        default=None, metadata={"help": "admit first after waiting this many iterations"}
    )
    age_late: bool = field(
        default=True,
        metadata={
            "help": "count only the admissions that passed a request after first-come "
            "first-served would have admitted it (passed minus the older requests still "
            "waiting): its lateness against count-jsq's order"
        },
    )
    kv_capacity: float | None = field(
        default=None, metadata={"help": "per-worker KV token capacity over the horizon"}
    )
    prefill_align: int = field(
        default=0,
        metadata={
            "help": "ranks that prefill (no separate prefill tier): hold admissions up to this "
            "many iterations until every rank has a free slot, so new prompts share steps "
            "(0: admit at once; router/policies/prefill_align.py)"
        },
    )
    guard: bool = field(
        default=True,
        metadata={
            "help": "do-no-harm guard where no twin drives the policy (twin=false in simulate, "
            "ab, evaluate; the service routes such a policy at w = 0, the gateway never "
            "guards): a deployable estimator's projection is used only while its "
            "decisions, judged on what happened one horizon later, beat those made without it"
        },
    )
    twin: bool = field(
        default=True,
        metadata={
            "help": "a twin beside the router (simulate, ab, evaluate, the service's /v1/route "
            "and the gateway: router/lab/twin/) chooses the blend weight w of "
            "P0 - w (P0 - P), starting "
            "at 0, in place of the guard; twin=false;guard=false uses the estimator as it is"
        },
    )
    twin_warm: float | None = field(
        default=None,
        metadata={
            "help": "share of an on-the-fly estimator's training portion the twin replays "
            "before the run (its own estimator fits on the rest; router/lab/twin/warmup.py): "
            "0 turns the warm start off; default the run's (2/3)"
        },
    )
    blend: float | None = field(
        default=None,
        metadata={"help": "a fixed blend weight w in [0, 1] (overrides the twin and the guard)"},
    )
    guard_stride: int = field(
        default=8, metadata={"help": "iterations between the guard's scored snapshots"}
    )
    guard_memory: float = field(
        default=64.0, metadata={"help": "scored snapshots the guard remembers (forgetting)"}
    )

    def __post_init__(self) -> None:
        checks = [
            (
                0 <= self.horizon <= MAX_HORIZON,
                f"horizon must be in 0..{MAX_HORIZON}, got {self.horizon}",
            ),
            (
                self.beta is None or 0 < self.beta <= MAX_BETA,
                f"beta must be > 0 and <= {MAX_BETA:g}, got {self.beta}",
            ),
            (
                all(map(_finite, (self.gamma, self.auto_gamma, self.confidence, self.beta))),
                "numbers must be finite",
            ),
            (0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma}"),
            (self.auto_gamma is None or self.auto_gamma > 0, "auto_gamma must be > 0"),
            (1 <= self.r_max <= 12, f"r_max must be in 1..12, got {self.r_max}"),
            (self.s_greedy is None or self.s_greedy >= 0, "s_greedy must be >= 0"),
            (
                1 <= self.window <= MAX_WINDOW,
                f"window must be in 1..{MAX_WINDOW}, got {self.window}",
            ),
            (self.projection in PROJECTIONS, f"projection must be one of {PROJECTIONS}"),
            (self.penalty in PENALTIES, f"penalty must be one of {PENALTIES}"),
            (0 < self.confidence <= 1, f"confidence must be in (0, 1], got {self.confidence}"),
            (self.refresh >= 1, f"refresh must be >= 1, got {self.refresh}"),
            (
                self.twin_warm is None or 0 <= self.twin_warm < 1,
                f"twin_warm must be in [0, 1), got {self.twin_warm}",
            ),
            (self.repredict >= 1, f"repredict must be >= 1, got {self.repredict}"),
            (self.predict_every >= 1, f"predict_every must be >= 1, got {self.predict_every}"),
            (self.max_overtake is None or self.max_overtake >= 1, "max_overtake must be >= 1"),
            (
                self.age_priority is None or 0 < self.age_priority < math.inf,
                f"age_priority must be a finite number > 0, got {self.age_priority}",
            ),
            (
                self.kv_capacity is None or 0 < self.kv_capacity < math.inf,
                "kv_capacity must be a finite number > 0",
            ),
            (
                0 <= self.prefill_align <= MAX_WINDOW,
                f"prefill_align must be in 0..{MAX_WINDOW}, got {self.prefill_align}",
            ),
            (
                self.max_wait_s is None or 0 <= self.max_wait_s < math.inf,
                f"max_wait_s must be a finite number >= 0, got {self.max_wait_s}",
            ),
            (
                self.max_wait_iters is None or self.max_wait_iters >= 1,
                f"max_wait_iters must be >= 1, got {self.max_wait_iters}",
            ),
            (
                self.blend is None or 0.0 <= self.blend <= 1.0,
                f"blend must be in [0, 1], got {self.blend}",
            ),
            (self.guard_stride >= 1, f"guard_stride must be >= 1, got {self.guard_stride}"),
            (self.guard_memory >= 1, f"guard_memory must be >= 1, got {self.guard_memory}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"invalid BalanceRoute configuration: {msg}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


BR0_DEFAULTS = BalanceRouteConfig(
    horizon=0,
    beta=None,
    gamma=0.64,
    auto_gamma=None,
    s_greedy=None,
    refill=False,
    refresh=1,
    projection="cutoff",
    age_priority=None,
)
BRH_DEFAULTS = BalanceRouteConfig()
# The paper's BR-H as published: (beta, gamma) = (14.67, 0.64), H = 80, predictions refreshed
# every H iterations, stage 2 once free slots are few, no fairness cap, no age priority, no
# do-no-harm guard, no twin.
PAPER_BRH = BalanceRouteConfig(
    horizon=DEFAULT_HORIZON,
    beta=14.67,
    gamma=0.64,
    refresh=DEFAULT_HORIZON,
    s_greedy=None,
    refill=False,
    auto_gamma=None,
    max_overtake=None,
    age_priority=None,
    projection="cutoff",
    guard=False,
    twin=False,
)

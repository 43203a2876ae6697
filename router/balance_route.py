"""BalanceRoute: BR-0 and BR-H, the two-stage admission-and-routing heuristic (DESIGN 5.2-5.4).

Within one routing step, with ``c_g`` free slots and ``S_tot = sum c_g``:

1. *Guard*: requests overdue (overtaken too often, or waiting too long) are admitted first, in
   release order, each to the open worker where it scores best.
2. *Stage 1*, while ``S_tot > S_greedy``: the worker with the most free slots (ties: smaller load)
   takes the single request of the pool's head window (``window`` requests) that scores best.
3. *Stage 2*: workers in descending ``(c_g, q_g)`` order (``q_g`` = smallest margin over the
   horizon) each take the best subset of at most ``c_g`` of the first ``R_max`` waiting requests
   (exact enumeration); if that score is not positive, the single best request instead. Passes
   repeat until admission is maximal.

Loads, margins and priorities are updated after every admission. ``br0`` scores current loads
(``H = 0, beta = G``); ``brh`` scores projected loads from a completion estimator.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np

from features.errors import UserError
from predict.base import CompletedBatch, CompletionEstimator, RunningBatch
from predict.no_prediction import NoPrediction
from predict.projection import (
    LoadProjection,
    cutoff_lengths,
    extend_survival,
    request_paths,
)
from router.policy import Policy, RunContext, register
from router.scoring import (
    best_subset,
    discount_weights,
    horizon_score,
    horizon_score_all,
    subset_members,
)
from router.state import Admissions, RouterState

PROJECTIONS = ("cutoff", "expected")
PENALTIES = ("sum", "max")


@dataclass(frozen=True, slots=True)
class BalanceRouteConfig:
    """Knobs of BR-0/BR-H. ``None`` for ``beta``/``s_greedy`` means ``G`` (number of workers)."""

    horizon: int = field(default=80, metadata={"help": "lookahead H in iterations"})
    beta: float | None = field(default=14.67, metadata={"help": "overflow penalty (None = G)"})
    gamma: float = field(default=0.64, metadata={"help": "discount per lookahead iteration"})
    r_max: int = field(default=4, metadata={"help": "stage-2 candidate window (subset search)"})
    s_greedy: int | None = field(
        default=None, metadata={"help": "stage 1 runs while free slots exceed this (None = G)"}
    )
    window: int = field(default=32, metadata={"help": "stage-1 candidate window"})
    projection: str = field(default="cutoff", metadata={"help": "cutoff | expected"})
    refill: bool = field(default=False, metadata={"help": "project freed slots refilled"})
    penalty: str = field(default="sum", metadata={"help": "sum | max over the horizon"})
    refresh: int = field(default=1, metadata={"help": "iterations between predictions"})
    max_overtake: int | None = field(
        default=1024, metadata={"help": "admit first once this many later requests passed"}
    )
    max_wait_s: float | None = field(
        default=None, metadata={"help": "admit first after waiting this many seconds"}
    )
    max_wait_iters: int | None = field(
        default=None, metadata={"help": "admit first after waiting this many iterations"}
    )
    kv_capacity: float | None = field(
        default=None, metadata={"help": "per-worker KV token capacity over the horizon"}
    )

    def __post_init__(self) -> None:
        checks = [
            (self.horizon >= 0, f"horizon must be >= 0, got {self.horizon}"),
            (self.beta is None or self.beta > 0, f"beta must be > 0, got {self.beta}"),
            (0 < self.gamma <= 1, f"gamma must be in (0, 1], got {self.gamma}"),
            (1 <= self.r_max <= 12, f"r_max must be in 1..12, got {self.r_max}"),
            (self.s_greedy is None or self.s_greedy >= 0, "s_greedy must be >= 0"),
            (self.window >= 1, f"window must be >= 1, got {self.window}"),
            (self.projection in PROJECTIONS, f"projection must be one of {PROJECTIONS}"),
            (self.penalty in PENALTIES, f"penalty must be one of {PENALTIES}"),
            (self.refresh >= 1, f"refresh must be >= 1, got {self.refresh}"),
            (self.max_overtake is None or self.max_overtake >= 1, "max_overtake must be >= 1"),
            (self.kv_capacity is None or self.kv_capacity > 0, "kv_capacity must be > 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"invalid BalanceRoute configuration: {msg}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


BR0_DEFAULTS = BalanceRouteConfig(horizon=0, beta=None, refresh=1)
BRH_DEFAULTS = BalanceRouteConfig()


class BalanceRoutePolicy(Policy):
    """The two-stage heuristic over projected margins; subclasses fix defaults and the estimator."""

    defaults: BalanceRouteConfig = BRH_DEFAULTS

    def __init__(
        self,
        config: BalanceRouteConfig | None = None,
        estimator: CompletionEstimator | None = None,
        **overrides: Any,
    ) -> None:
        cfg = config or self.defaults
        if overrides:
            unknown = set(overrides) - set(BalanceRouteConfig.__dataclass_fields__)
            if unknown:
                raise UserError(
                    f"unknown {self.name} option(s) {sorted(unknown)}; known: "
                    f"{sorted(BalanceRouteConfig.__dataclass_fields__)}"
                )
            cfg = replace(cfg, **overrides)
        self.config = cfg
        self.estimator = estimator
        self.maximal = cfg.kv_capacity is None

    # ---- lifecycle -------------------------------------------------------------------------
    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        cfg = self.config
        g = ctx.workers
        self.beta = float(g if cfg.beta is None else cfg.beta)
        self.s_greedy = g if cfg.s_greedy is None else cfg.s_greedy
        self.weights = discount_weights(cfg.horizon, cfg.gamma)
        self.hs = np.arange(cfg.horizon + 1, dtype=np.float64)
        if cfg.horizon > 0 and self.estimator is None:
            self.estimator = NoPrediction(horizon=cfg.horizon).fit()
        if self.estimator is not None and self.estimator.horizon < cfg.horizon:
            raise UserError(
                f"estimator '{self.estimator.name}' predicts {self.estimator.horizon} iterations "
                f"ahead but the router looks {cfg.horizon} ahead"
            )
        self.projection = LoadProjection(g, cfg.horizon, cfg.refresh, ctx.requests.size)
        self.stats = {"guard_admissions": 0, "refreshes": 0, "stage1_admissions": 0,
                      "stage2_admissions": 0, "fallback_singles": 0}

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        if self.config.horizon > 0 and self.projection.k0 is not None:
            self.projection.remove(positions)
        if self.estimator is not None and self.config.horizon > 0:
            table = self.ctx.requests
            self.estimator.observe(
                CompletedBatch(
                    prompt_tokens=table.prompt_tokens[positions],
                    output_tokens=np.asarray(output_tokens, dtype=np.int64),
                    prompt_key=table.prompt_key[positions],
                    time_s=np.full(positions.shape[0], float(finish_s)),
                )
            )

    def run_stats(self) -> dict[str, Any]:
        return dict(self.stats)

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, **self.config.as_dict()}
        if self.estimator is not None and self.config.horizon > 0:
            out["estimator"] = self.estimator.name
        return out

    # ---- projection ------------------------------------------------------------------------
    def _projected_loads(self, state: RouterState) -> np.ndarray:
        cfg = self.config
        if cfg.horizon == 0:
            return state.loads[:, None].copy()
        k = state.iteration
        proj = self.projection
        if proj.k0 is None or k - proj.k0 >= cfg.refresh or k < proj.k0:
            self._refresh(state)
        return proj.view(k, state.loads)

    def _refresh(self, state: RouterState) -> None:
        cfg = self.config
        run = state.running()
        table = state.requests
        proj = self.projection
        refill = self._typical_prompt(state) if cfg.refill else None
        batch = RunningBatch(
            prompt_tokens=run.prompt_tokens,
            age=run.age,
            prompt_key=table.prompt_key[run.position],
            request_index=table.trace_index[run.position],
            time_s=state.time_s,
        )
        expected = cfg.projection == "expected"
        pred = self.estimator.predict(batch, survival=expected)
        if expected and pred.survival is not None:
            surv = extend_survival(pred.survival[:, : cfg.horizon + 1], proj.length)
            surv[:, 0] = 1.0
            paths = request_paths(run.workload, surv, refill)
            proj.rebuild_paths(state.iteration, run.position, run.worker, paths)
        else:
            lengths = cutoff_lengths(pred.c, cfg.horizon, proj.length)
            proj.rebuild_cutoff(
                state.iteration, run.position, run.worker, run.workload, lengths, refill
            )
        self.stats["refreshes"] += 1

    def _typical_prompt(self, state: RouterState) -> float:
        head = state.pool.head(64)
        if head.size:
            return float(np.median(state.requests.prompt_tokens[head]))
        return float(np.median(state.requests.prompt_tokens[: max(1, state.requests.size)]))

    # ---- the decision ----------------------------------------------------------------------
    def route(self, state: RouterState) -> Admissions:
        due = state.admissions_due
        if due == 0:
            return Admissions.empty()
        cfg = self.config
        step = _Step(self, state, self._margins(state), due)
        step.admit_overdue()
        while step.remaining and step.total_free > self.s_greedy:
            if not step.stage1():
                break
        while step.remaining:
            if not step.stage2_pass():
                break
        if cfg.horizon > 0:
            prompts = state.requests.prompt_tokens
            for p, g in zip(step.out_pos, step.out_wk, strict=True):
                self.projection.add(p, g, float(prompts[p]), state.iteration)
        return Admissions(
            np.asarray(step.out_pos, dtype=np.int64), np.asarray(step.out_wk, dtype=np.int64)
        )


    def _margins(self, state: RouterState) -> _Margins:
        """Scalar margins at ``H = 0`` (plain floats are faster there), else projected rows."""
        if self.config.horizon == 0:
            return _CurrentMargins(self, state.loads.tolist())
        return _ProjectedMargins(self, self._projected_loads(state))


class _Margins:
    """Scores against per-worker margins; one backend per horizon kind, same stage logic."""

    def load_now(self, g: int) -> float:
        raise NotImplementedError  # pragma: no cover - interface

    def min_margins(self, workers: list[int]) -> list[float]:
        raise NotImplementedError  # pragma: no cover - interface

    def scores(self, g: int, b: list[float]) -> list[float]:
        raise NotImplementedError  # pragma: no cover - interface

    def scores_all(self, b: float, workers: list[int]) -> list[float]:
        raise NotImplementedError  # pragma: no cover - interface

    def subset(self, g: int, prompts: list[float], size: int) -> tuple[list[int], float]:
        raise NotImplementedError  # pragma: no cover - interface

    def add(self, g: int, total: float, count: int) -> None:
        raise NotImplementedError  # pragma: no cover - interface

    def room(self, g: int, count: int) -> float:
        """Largest total prompt ``count`` new requests may add to ``g`` (KV capacity)."""
        raise NotImplementedError  # pragma: no cover - interface


class _CurrentMargins(_Margins):
    """``H = 0``: margins are scalars ``max_g L_g - L_g``; plain floats beat numpy here."""

    def __init__(self, policy: BalanceRoutePolicy, loads: list[float]) -> None:
        self.loads = loads
        self.top = max(loads)
        self.beta = policy.beta
        self.capacity = policy.config.kv_capacity

    def load_now(self, g: int) -> float:
        return self.loads[g]

    def min_margins(self, workers: list[int]) -> list[float]:
        return [self.top - self.loads[g] for g in workers]

    def scores(self, g: int, b: list[float]) -> list[float]:
        m, beta = self.top - self.loads[g], self.beta
        return [x - beta * (x - m if x > m else 0.0) for x in b]

    def scores_all(self, b: float, workers: list[int]) -> list[float]:
        top, beta, loads = self.top, self.beta, self.loads
        return [b - beta * max(0.0, b - (top - loads[g])) for g in workers]

    def subset(self, g: int, prompts: list[float], size: int) -> tuple[list[int], float]:
        m, beta = self.top - self.loads[g], self.beta
        room = self.room(g, 1)
        best, best_score = [], -np.inf
        for members in subset_members(len(prompts)):
            if len(members) > size:
                continue
            b = 0.0
            for i in members:
                b += prompts[i]
            if b > room:
                continue
            score = b - beta * (b - m if b > m else 0.0)
            if score > best_score:
                best, best_score = members, score
        return list(best), best_score

    def add(self, g: int, total: float, count: int) -> None:
        self.loads[g] += total
        if self.loads[g] > self.top:
            self.top = self.loads[g]

    def room(self, g: int, count: int) -> float:
        return np.inf if self.capacity is None else self.capacity - self.loads[g]


class _ProjectedMargins(_Margins):
    """``H > 0``: margins ``m_{g,h}`` over the horizon, as ``(G, H+1)`` numpy rows."""

    def __init__(self, policy: BalanceRoutePolicy, loads: np.ndarray) -> None:
        self.loads = loads
        self.top = loads.max(axis=0)
        self.beta = policy.beta
        self.weights = policy.weights
        self.total_weight = float(policy.weights.sum())
        self.hs = policy.hs
        self.penalty = policy.config.penalty
        self.capacity = policy.config.kv_capacity

    def load_now(self, g: int) -> float:
        return float(self.loads[g, 0])

    def min_margins(self, workers: list[int]) -> list[float]:
        return (self.top[None, :] - self.loads[workers]).min(axis=1).tolist()

    def scores(self, g: int, b: list[float]) -> list[float]:
        return horizon_score(
            np.asarray(b), self.top - self.loads[g], self.weights, self.beta, self.penalty
        ).tolist()

    def scores_all(self, b: float, workers: list[int]) -> list[float]:
        margins = self.top[None, :] - self.loads[workers]
        return horizon_score_all(b, margins, self.weights, self.beta, self.penalty).tolist()

    def subset(self, g: int, prompts: list[float], size: int) -> tuple[list[int], float]:
        slack = None
        if self.capacity is not None:
            slack = np.array([self.room(g, q) for q in range(size + 1)])
        chosen, score = best_subset(
            np.asarray(prompts), self.top - self.loads[g], self.weights, self.beta, size,
            self.penalty, slack,
        )
        return chosen.tolist(), score

    def add(self, g: int, total: float, count: int) -> None:
        row = self.loads[g]
        row += total
        if count:
            row += count * self.hs
        np.maximum(self.top, row, out=self.top)

    def room(self, g: int, count: int) -> float:
        if self.capacity is None:
            return np.inf
        return float((self.capacity - self.loads[g] - count * self.hs).min())


class _Step:
    """One routing step: the stage logic over a margins backend, free slots and candidates."""

    def __init__(
        self, policy: BalanceRoutePolicy, state: RouterState, margins: _Margins, due: int
    ) -> None:
        cfg = policy.config
        self.policy = policy
        self.cfg = cfg
        self.state = state
        self.m = margins
        self.free = state.free_slots.tolist()
        self.total_free = sum(self.free)
        self.remaining = due
        cand = state.pool.head(due + max(cfg.window, cfg.r_max))
        self.cand = cand
        self.prompts = state.requests.prompt_tokens[cand].tolist()
        self.avail = list(range(len(self.prompts)))  # indices into cand, in pool order
        self.blocked: set[int] = set()  # workers where nothing fits under the KV capacity
        self.out_pos: list[int] = []
        self.out_wk: list[int] = []
        self.stats = policy.stats

    def admit(self, idxs: list[int], g: int) -> None:
        total = 0.0
        for i in idxs:
            self.avail.remove(i)
            self.out_pos.append(int(self.cand[i]))
            self.out_wk.append(g)
            total += self.prompts[i]
        self.m.add(g, total, len(idxs))
        self.free[g] -= len(idxs)
        self.total_free -= len(idxs)
        self.remaining -= len(idxs)

    def open_workers(self) -> list[int]:
        blocked = self.blocked
        return [g for g, c in enumerate(self.free) if c > 0 and g not in blocked]

    def admit_overdue(self) -> None:
        """The fairness guard: overdue requests go first, each where it scores best."""
        cfg, pool = self.cfg, self.state.pool
        checks = []
        if cfg.max_overtake is not None:
            checks.append(pool.overtaken(self.cand) >= cfg.max_overtake)
        if cfg.max_wait_iters is not None:
            checks.append(pool.waited_iterations(self.cand) >= cfg.max_wait_iters)
        if cfg.max_wait_s is not None:
            checks.append(pool.waited_seconds(self.cand) >= cfg.max_wait_s)
        if not checks:
            return
        overdue = np.flatnonzero(np.logical_or.reduce(checks)).tolist()
        for i in overdue:
            open_ = self.open_workers()
            if not self.remaining or not open_:
                return
            b = self.prompts[i]
            scores = self.m.scores_all(b, open_)
            fits = [s if self.m.room(g, 1) >= b else -np.inf for g, s in zip(open_, scores,
                                                                              strict=True)]
            j = max(range(len(open_)), key=fits.__getitem__)
            if fits[j] == -np.inf:
                continue
            self.admit([i], open_[j])
            self.stats["guard_admissions"] += 1

    def stage1(self) -> bool:
        """The worker with the most free slots takes the best single request of the window."""
        open_ = self.open_workers()
        if not open_ or not self.avail:
            return False
        free, m = self.free, self.m
        g = min(open_, key=lambda w: (-free[w], m.load_now(w)))
        window = self.avail[: self.cfg.window]
        b = [self.prompts[i] for i in window]
        scores = m.scores(g, b)
        room = m.room(g, 1)
        best, best_score = -1, -np.inf
        for j, (x, s) in enumerate(zip(b, scores, strict=True)):
            if s > best_score and x <= room:
                best, best_score = j, s
        if best < 0:
            self.blocked.add(g)
            return True
        self.admit([window[best]], g)
        self.stats["stage1_admissions"] += 1
        return True

    def stage2_pass(self) -> bool:
        """Workers in descending (free, min margin) take their best subset of the head."""
        visited: set[int] = set()
        progressed = False
        free, m = self.free, self.m
        while self.remaining and self.avail:
            open_ = [g for g in self.open_workers() if g not in visited]
            if not open_:
                break
            q = m.min_margins(open_)
            j = max(range(len(open_)), key=lambda i: (free[open_[i]], q[i], -i))
            g = open_[j]
            visited.add(g)
            window = self.avail[: self.cfg.r_max]
            prompts = [self.prompts[i] for i in window]
            size = min(free[g], self.remaining)
            chosen, score = m.subset(g, prompts, size)
            if not chosen:
                self.blocked.add(g)
                continue
            if score <= 0 and len(chosen) > 1:
                chosen, _ = m.subset(g, prompts, 1)
                self.stats["fallback_singles"] += 1
            self.admit([window[c] for c in chosen], g)
            self.stats["stage2_admissions"] += len(chosen)
            progressed = True
        return progressed


@register
class BR0Policy(BalanceRoutePolicy):
    """BR-0: current loads only (``H = 0``, ``beta = G``): the paper's prediction-free router."""

    name = "br0"
    defaults = BR0_DEFAULTS


@register
class BRHPolicy(BalanceRoutePolicy):
    """BR-H: margins projected ``H`` iterations ahead from a completion estimator."""

    name = "brh"
    defaults = BRH_DEFAULTS

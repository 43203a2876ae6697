"""BalanceRoute: BR-0 and BR-H, the two-stage admission-and-routing heuristic (docs/design.md, "BR-0 and BR-H").

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

from dataclasses import replace
from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletedBatch, CompletionEstimator, RunningBatch
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.projection import (
    LoadProjection,
    extend_survival,
    request_paths,
)
from balanceroute.router.balance_config import (
    BR0_DEFAULTS,
    BRH_DEFAULTS,
    GAMMA_MAX,
    GAMMA_MIN,
    PAPER_BRH,
    BalanceRouteConfig,
)
from balanceroute.router.kernels import (
    FALLBACK,
    GUARD,
    STAGE1,
    STAGE2,
    br_step,
    compile_kernels,
)
from balanceroute.router.policy import Policy, RunContext
from balanceroute.router.scoring import discount_weights
from balanceroute.router.state import Admissions, RouterState


def resolve_projection(projection: str, estimator: CompletionEstimator | None) -> str:
    """The projection ``auto`` stands for with this estimator: its own preference (survival
    curves for the learned estimators, cutoffs for point predictions), cutoff without curves."""
    if projection != "auto":
        return projection
    if estimator is None or not estimator.provides_survival:
        return "cutoff"
    return estimator.projection


def confident_cutoff(
    p_finish: np.ndarray, c: np.ndarray, horizon: int, confidence: float
) -> np.ndarray:
    """Cutoffs only for confident departures: ``E[r | r <= H]`` where ``p_finish`` reaches
    ``confidence``, else "survives the window" (``H``). Uncertain departures are left out."""
    p = np.asarray(p_finish, dtype=np.float64)
    within = (np.asarray(c, dtype=np.float64) - (1.0 - p) * horizon) / np.maximum(p, 1e-9)
    return np.where(p >= confidence, np.clip(within, 1.0, horizon), float(horizon))


class OutputMean:
    """Exponentially weighted mean of finished requests' output lengths (about 1,000 of them)."""

    def __init__(self, weight: float = 1e-3) -> None:
        self.weight = weight
        self.mean = 0.0
        self.seen = 0

    def update(self, outputs: np.ndarray) -> float:
        for x in np.asarray(outputs, dtype=np.float64).tolist():
            self.seen += 1
            w = max(self.weight, 1.0 / self.seen)
            self.mean += w * (x - self.mean)
        return self.mean


class BalanceRoutePolicy(Policy):
    """The two-stage heuristic over projected margins; subclasses fix defaults and the estimator."""

    options = BalanceRouteConfig
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
        self.gamma = cfg.gamma
        self.weights = discount_weights(cfg.horizon, cfg.gamma)
        self.output_mean = OutputMean()
        self.hs = np.arange(cfg.horizon + 1, dtype=np.float64)
        if cfg.horizon > 0 and self.estimator is None:
            self.estimator = NoPrediction(horizon=cfg.horizon).fit()
        if self.estimator is not None and self.estimator.horizon < cfg.horizon:
            raise UserError(
                f"estimator '{self.estimator.name}' predicts {self.estimator.horizon} iterations "
                f"ahead but the router looks {cfg.horizon} ahead"
            )
        self.projection = LoadProjection(g, cfg.horizon, cfg.refresh, ctx.requests.size)
        self.projection_mode = resolve_projection(cfg.projection, self.estimator)
        compile_kernels()
        self.counters = np.zeros(4, dtype=np.int64)
        self.refreshes = 0

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        if self.config.auto_gamma is not None and self.config.horizon > 0:
            self._adapt_gamma(output_tokens)
        if self.config.horizon > 0 and self.projection.k0 is not None:
            self.projection.remove(positions)
        if self.estimator is not None and self.config.horizon > 0 and self.estimator.learns_online:
            table = self.ctx.requests
            self.estimator.observe(
                CompletedBatch(
                    prompt_tokens=table.prompt_tokens[positions],
                    output_tokens=np.asarray(output_tokens, dtype=np.int64),
                    prompt_key=table.prompt_key[positions],
                    time_s=np.full(positions.shape[0], float(finish_s)),
                )
            )

    def _adapt_gamma(self, output_tokens: np.ndarray) -> None:
        """Auto discount: the lookahead that pays grows with the typical output length."""
        mean = self.output_mean.update(output_tokens)
        gamma = float(np.clip(1.0 - self.config.auto_gamma / mean, GAMMA_MIN, GAMMA_MAX))
        if abs(gamma - self.gamma) > 0.002:
            self.gamma = gamma
            self.weights = discount_weights(self.config.horizon, gamma)

    def run_stats(self) -> dict[str, Any]:
        c = self.counters.tolist()
        return {
            "guard_admissions": c[GUARD],
            "stage1_admissions": c[STAGE1],
            "stage2_admissions": c[STAGE2],
            "fallback_singles": c[FALLBACK],
            "prediction_refreshes": self.refreshes,
            "final_gamma": self.gamma,
        }

    def describe(self) -> dict[str, Any]:
        out = {"name": self.name, **self.config.as_dict()}
        if self.estimator is not None and self.config.horizon > 0:
            out["estimator"] = self.estimator.name
            out["projection_used"] = resolve_projection(self.config.projection, self.estimator)
        return out

    # ---- projection ------------------------------------------------------------------------
    def projected_loads(self, state: RouterState, waiting: np.ndarray) -> np.ndarray:
        """Loads ``(G, H+1)`` the step scores against (a fresh array the kernel may update).

        ``waiting`` holds the prompt sizes at the head of the pool (the refill's typical prompt).
        """
        cfg = self.config
        if cfg.horizon == 0:
            return state.loads[:, None].copy()
        k = state.iteration
        proj = self.projection
        if proj.k0 is None or k - proj.k0 >= cfg.refresh or k < proj.k0:
            self._refresh(state, waiting)
        return proj.view(k, state.loads)

    def _refresh(self, state: RouterState, waiting: np.ndarray) -> None:
        cfg = self.config
        run = state.running()
        table = state.requests
        proj = self.projection
        refill = None
        if cfg.refill and waiting.size:
            ordered = sorted(waiting.tolist())
            refill = float(ordered[len(ordered) // 2])
        batch = RunningBatch(
            prompt_tokens=run.prompt_tokens,
            age=run.age,
            prompt_key=table.prompt_key[run.position],
            request_index=table.trace_index[run.position],
            time_s=state.time_s,
        )
        expected = self.projection_mode == "expected"
        pred = self.estimator.predict(batch, survival=expected)
        if expected and pred.survival is not None:
            surv = extend_survival(pred.survival[:, : cfg.horizon + 1], proj.length)
            surv[:, 0] = 1.0
            paths = request_paths(run.workload, surv, refill)
            proj.rebuild_paths(state.iteration, run.position, run.worker, paths)
        else:
            c = pred.c
            if self.projection_mode == "confident":
                c = confident_cutoff(pred.p_finish, pred.c, cfg.horizon, cfg.confidence)
            proj.rebuild_cutoff(state.iteration, run.position, run.worker, run.workload, c, refill)
        self.refreshes += 1

    # ---- the decision ----------------------------------------------------------------------
    def route(self, state: RouterState) -> Admissions:
        due = state.admissions_due
        if due == 0:
            return Admissions.empty()
        cfg = self.config
        cand = state.pool.head(due + max(cfg.window, cfg.r_max))
        prompts = state.requests.prompt_tokens[cand].astype(np.float64)
        loads = self.projected_loads(state, prompts)
        idx, workers = br_step(
            loads,
            state.free_slots.copy(),
            prompts,
            self._overdue(state, cand),
            self.weights,
            self.beta,
            cfg.penalty == "max",
            np.inf if cfg.kv_capacity is None else float(cfg.kv_capacity),
            self.s_greedy,
            cfg.window,
            cfg.r_max,
            due,
            self.counters,
        )
        positions = cand[idx]
        if cfg.horizon > 0:
            k = state.iteration
            add = self.projection.add
            for p, g, b in zip(
                positions.tolist(), workers.tolist(), prompts[idx].tolist(), strict=True
            ):
                add(p, g, b, k)
        return Admissions(positions, workers)

    def _overdue(self, state: RouterState, cand: np.ndarray) -> np.ndarray:
        """The fairness guard: candidates overtaken too often or waiting too long."""
        cfg, pool = self.config, state.pool
        out = np.zeros(cand.shape[0], dtype=np.bool_)
        if cfg.max_overtake is not None:
            out |= pool.overtaken(cand) >= cfg.max_overtake
        if cfg.max_wait_iters is not None:
            out |= pool.waited_iterations(cand) >= cfg.max_wait_iters
        if cfg.max_wait_s is not None:
            out |= pool.waited_seconds(cand) >= cfg.max_wait_s
        return out


class BR0Policy(BalanceRoutePolicy):
    """BR-0: current loads only (``H = 0``, ``beta = G``): the paper's prediction-free router."""

    name = "br0"
    defaults = BR0_DEFAULTS
    takes_estimator = False


class BRHPolicy(BalanceRoutePolicy):
    """BR-H: margins projected ``H`` iterations ahead from a completion estimator."""

    name = "brh"
    defaults = BRH_DEFAULTS
    takes_estimator = True


class PaperBRHPolicy(BalanceRoutePolicy):
    """BR-H exactly as the paper published it (``beta, gamma = 14.67, 0.64``), for comparison."""

    name = "brh-paper"
    defaults = PAPER_BRH
    takes_estimator = True

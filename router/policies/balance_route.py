"""BalanceRoute: BR-0 and BR-H, the two-stage admission-and-routing heuristic (docs/design.md, "BR-0 and BR-H").

Within one routing step, with ``c_g`` free slots and ``S_tot = sum c_g``:

1. *Fairness cap*: requests overdue (overtaken too often, or waiting too long) are admitted first, in
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
from balanceroute.predict.base import CompletedBatch, CompletionEstimator, Fitting, RunningBatch
from balanceroute.predict.incremental import CurveCache, conditioned_loads
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.predict.projection import (
    LoadProjection,
    cutoff_survival,
    extend_survival,
    request_paths,
)
from balanceroute.router.policies import fairness
from balanceroute.router.policies.balance_config import (
    BR0_DEFAULTS,
    BRH_DEFAULTS,
    GAMMA_MAX,
    GAMMA_MIN,
    PAPER_BRH,
    BalanceRouteConfig,
)
from balanceroute.router.policies.guard import ProjectionGuard
from balanceroute.router.policies.kernels import (
    FAIRNESS,
    FALLBACK,
    STAGE1,
    STAGE2,
    br_step,
    compile_kernels,
    stage1_worker,
)
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.prefill_align import PrefillAlign
from balanceroute.router.policies.scoring import OutputMean, discount_weights
from balanceroute.router.policies.state import Admissions, RouterState


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


def guard_applies(estimator: CompletionEstimator | None) -> bool:
    """Whether the do-no-harm guard watches this estimator: deployable ones that predict
    something (the references and ``none`` are measured as they are)."""
    return estimator is not None and estimator.deployable and estimator.fitting is not Fitting.NONE


MAX_PENDING = 64  # completion batches held for the estimator at most (bounded memory)


class BalanceRoutePolicy(Policy):
    """The two-stage heuristic over projected margins; subclasses fix defaults and the estimator."""

    options = BalanceRouteConfig
    batches = True
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
        self.maximal = cfg.kv_capacity is None and cfg.prefill_align == 0

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
        self.cache = None
        if cfg.incremental and cfg.horizon > 0 and self.projection_mode == "expected":
            self.cache = CurveCache(cfg.horizon, ctx.requests.size)
            self.last_call: int | None = None
            self.pending: list[CompletedBatch] = []  # completions not yet shown to the estimator
            self.predicted_rows = 0
        compile_kernels()
        self.counters = np.zeros(4, dtype=np.int64)
        self.align = PrefillAlign(cfg.prefill_align, ctx.slots) if cfg.prefill_align else None
        self.refreshes = 0
        self.refill_prompt: float | None = None
        self.guard = None
        # the blend weight w of P0 - w (P0 - P): fixed, or set by a twin (router/lab/twin/)
        # that then also stands in for the guard; None: the estimator's P (or the guard's)
        self.blend: float | None = None
        if cfg.horizon > 0 and cfg.blend is not None:
            self.blend = float(cfg.blend)
        if cfg.blend is None and cfg.guard and cfg.horizon > 0 and guard_applies(self.estimator):
            self.guard = ProjectionGuard(
                g, cfg.horizon, g * ctx.slots, stride=cfg.guard_stride, memory=cfg.guard_memory
            )
            self.worker_of: dict[int, int] = {}  # running requests' workers, for the guard

    @property
    def twin_managed(self) -> bool:
        """Whether a twin, where one runs, chooses this policy's blend weight: BR-H with a
        deployable estimator, the twin on and no fixed blend."""
        cfg = self.config
        return cfg.twin and cfg.blend is None and cfg.horizon > 0 and guard_applies(self.estimator)

    def set_blend(self, weight: float) -> None:
        """A twin's weight: used from the next routing step on, in place of the guard."""
        self.guard = None
        self.blend = float(weight)

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        if self.config.auto_gamma is not None and self.config.horizon > 0:
            self._adapt_gamma(output_tokens)
        if self.config.horizon > 0 and self.projection.k0 is not None:
            self.projection.remove(positions)
        if self.cache is not None:
            self.cache.release(positions)
        if self.guard is not None:
            self.guard.departed(
                iteration,
                np.array([self.worker_of.pop(p, 0) for p in positions.tolist()], dtype=np.int64),
                self.ctx.requests.prompt_tokens[positions],
                iteration - np.asarray(output_tokens, dtype=np.int64),
            )
        if self.estimator is not None and self.config.horizon > 0 and self.estimator.learns_online:
            done = CompletedBatch.from_positions(
                self.ctx.requests, positions, output_tokens, finish_s
            )
            if self.cache is None:
                self.estimator.observe(done)
            else:  # shown to the estimator before its next prediction, in one batch
                self.pending.append(done)
                if len(self.pending) >= MAX_PENDING:
                    self._flush_completions()

    def _flush_completions(self) -> None:
        """Completions since the last prediction go to the estimator, in finish order."""
        if not self.pending:
            return
        parts = self.pending
        self.pending = []
        self.estimator.observe(
            CompletedBatch(
                prompt_tokens=np.concatenate([b.prompt_tokens for b in parts]),
                output_tokens=np.concatenate([b.output_tokens for b in parts]),
                prompt_key=np.concatenate([b.prompt_key for b in parts]),
                time_s=np.concatenate([b.time_s for b in parts]),
            )
        )

    def _adapt_gamma(self, output_tokens: np.ndarray) -> None:
        """Auto discount: a worker of ``B`` slots gets about ``B / mean output`` admissions an
        iteration in steady state, each a chance for the router to correct its load; the
        lookahead that pays is about the time to the next one (docs/design.md, "Short
        outputs")."""
        mean = self.output_mean.update(output_tokens)
        turnover = self.config.auto_gamma * self.ctx.slots / mean
        gamma = float(np.clip(1.0 - turnover, GAMMA_MIN, GAMMA_MAX))
        if abs(gamma - self.gamma) > 0.002:
            self.gamma = gamma
            self.weights = discount_weights(self.config.horizon, gamma)

    def run_stats(self) -> dict[str, Any]:
        c = self.counters.tolist()
        return {
            "fairness_admissions": c[FAIRNESS],
            "stage1_admissions": c[STAGE1],
            "stage2_admissions": c[STAGE2],
            "fallback_singles": c[FALLBACK],
            "prediction_refreshes": self.refreshes,
            **({} if self.cache is None else {"predicted_rows": self.predicted_rows}),
            "final_gamma": self.gamma,
            **({} if self.guard is None else self.guard.stats()),
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
        if self.estimator.name == NoPrediction.name:  # none's P is P0: no projection to keep
            self.projection.k0 = None
            return self._blended(state, waiting, 0.0)
        if self.blend is not None:
            return self._blended(state, waiting, self.blend)
        k = state.iteration
        guard = self.guard
        if guard is not None:
            none = state.loads[:, None] + state.active[:, None].astype(np.float64) * self.hs
            self.views = (none, None)
            if guard.weight == 0.0 and not guard.due(k):  # stepping aside: nothing to predict
                self._refill(waiting)
                return guard.use(none, none)
        if self.cache is not None:
            loads = self._incremental(state, waiting)
        else:
            proj = self.projection
            if proj.k0 is None or k - proj.k0 >= cfg.refresh or k < proj.k0:
                self._refresh(state, waiting)
            loads = proj.view(k, state.loads)
        if guard is None:
            return loads
        self.views = (none, loads)
        return guard.use(none, loads)

    def _blended(self, state: RouterState, waiting: np.ndarray, w: float) -> np.ndarray:
        """``P0 - w (P0 - P)``: the estimator's projection shrunk toward the prediction-free
        one (``w = 0`` asks the estimator nothing)."""
        none = state.loads[:, None] + state.active[:, None].astype(np.float64) * self.hs
        if w == 0.0:
            self._refill(waiting)
            return none
        if self.cache is not None:
            loads = self._incremental(state, waiting)
        else:
            proj, k = self.projection, state.iteration
            if proj.k0 is None or k - proj.k0 >= self.config.refresh or k < proj.k0:
                self._refresh(state, waiting)
            loads = proj.view(k, state.loads)
        if w == 1.0:
            return loads
        return none - w * (none - loads)

    def _refill(self, waiting: np.ndarray) -> float | None:
        """The typical waiting prompt a freed slot is projected to be refilled with."""
        refill = None
        if self.config.refill and waiting.size:
            ordered = sorted(waiting.tolist())
            refill = float(ordered[len(ordered) // 2])
        self.refill_prompt = refill
        return refill

    def _incremental(self, state: RouterState, waiting: np.ndarray) -> np.ndarray:
        """Projected loads from cached curves advanced by age; the estimator is asked (at most
        every ``refresh`` iterations) only for requests with no curve or a stale one."""
        cfg = self.config
        run = state.running()
        cache = self.cache
        rows = cache.rows(run.position)
        k = state.iteration
        if self.last_call is None or k - self.last_call >= cfg.predict_every:
            sel = np.flatnonzero(cache.stale(rows, k, cfg.repredict))
            if sel.size:
                self._flush_completions()
                table = state.requests
                pos = run.position[sel]
                batch = RunningBatch(
                    prompt_tokens=run.prompt_tokens[sel],
                    age=run.age[sel],
                    prompt_key=table.prompt_key[pos],
                    request_index=table.trace_index[pos],
                    time_s=state.time_s,
                )
                pred = self.estimator.predict(batch, survival=True)
                surv = pred.survival
                if surv is None:  # an answer without curves: its cutoffs
                    surv = cutoff_survival(pred.c, cfg.horizon, cfg.horizon + 1)
                cache.store(rows[sel], surv, run.age[sel], k)
                self.last_call = k
                self.refreshes += 1
                self.predicted_rows += int(sel.size)
        refill = self._refill(waiting)
        loads = conditioned_loads(
            rows,
            run.age,
            run.worker,
            run.workload.astype(np.float64),
            cache.curves,
            cache.pred_age,
            cache.known,
            -1.0 if refill is None else refill,
            state.workers,
        )
        loads[:, 0] = state.loads
        return loads

    def _refresh(self, state: RouterState, waiting: np.ndarray) -> None:
        cfg = self.config
        run = state.running()
        table = state.requests
        proj = self.projection
        refill = self._refill(waiting)
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
        if due == 0 or (self.align is not None and self.align.holds(state)):
            return Admissions.empty()
        cfg = self.config
        cand = state.pool.head(due + max(cfg.window, cfg.r_max))
        if cand.shape[0] == 1 and self._scores_aside():
            lone = self._lone(state, cand)
            if lone is not None:
                return lone
        prompts = state.requests.prompt_tokens[cand].astype(np.float64)
        loads = self.projected_loads(state, prompts)
        overdue = fairness.overdue(cfg, state.pool, cand)
        bonus = fairness.age_priority(cfg, state.pool, cand, prompts, self.weights)
        idx, workers = self._step(loads, state, prompts, overdue, bonus, due, self.counters)
        if self.guard is not None and self.guard.due(state.iteration):
            self._keep_snapshot(state, prompts, overdue, bonus, due, (prompts[idx], workers))
        positions = cand[idx]
        if cfg.horizon > 0 and self.cache is None and self.projection.k0 is not None:
            k = state.iteration
            add = self.projection.add
            for p, g, b in zip(
                positions.tolist(), workers.tolist(), prompts[idx].tolist(), strict=True
            ):
                add(p, g, b, k)
        if self.guard is not None:
            self.worker_of.update(zip(positions.tolist(), workers.tolist(), strict=True))
        return Admissions(positions, workers)

    def _scores_aside(self) -> bool:
        """Whether the step's scores use the current loads and nothing is kept of them: no
        projection (``H = 0``) or the prediction-free one kept nowhere, no guard, no KV cap."""
        cfg = self.config
        if self.guard is not None or cfg.kv_capacity is not None:
            return False
        none = self.estimator is None or self.estimator.name == NoPrediction.name
        return cfg.horizon == 0 or ((none or self.blend == 0.0) and self.projection.k0 is None)

    def _lone(self, state: RouterState, cand: np.ndarray) -> Admissions | None:
        """One waiting request, not overdue, in stage 1 (free slots above ``s_greedy``): stage
        1's worker takes it whatever it scores, so no projection is built (the same decision and
        counts as :meth:`_step`); None where the step must run."""
        cfg = self.config
        free = state.free_total if state.free_total >= 0 else int(state.free_slots.sum())
        if free <= self.s_greedy or fairness.overdue(cfg, state.pool, cand)[0]:
            return None
        g = stage1_worker(state.free_slots, state.loads)
        if g < 0:
            return None
        if cfg.horizon > 0:  # as the step's _refill: the one waiting prompt
            refill = state.requests.prompt_tokens[cand[0]] if cfg.refill else None
            self.refill_prompt = None if refill is None else float(refill)
        self.counters[STAGE1] += 1
        return Admissions(cand, np.array([g], dtype=np.int64))

    def _step(self, loads, state, prompts, overdue, bonus, due, counters):
        """One compiled step on ``loads`` (updated in place): candidate indices and workers."""
        cfg = self.config
        return br_step(
            loads,
            state.free_slots.copy(),
            prompts,
            overdue,
            bonus,
            self.weights,
            self.beta,
            cfg.penalty == "max",
            np.inf if cfg.kv_capacity is None else float(cfg.kv_capacity),
            self.s_greedy,
            cfg.window,
            cfg.r_max,
            due,
            counters,
        )

    def _keep_snapshot(self, state, prompts, overdue, bonus, due, decided) -> None:
        """The guard's snapshot: this step's decision and the one the other projection (the
        estimator's, or none) would have made, to be judged on what happens."""
        none, estimated = self.views
        with_estimator = self.guard.weight == 1.0
        other = (none if with_estimator else estimated).copy()
        counters = np.zeros(4, np.int64)
        o_idx, o_workers = self._step(other, state, prompts, overdue, bonus, due, counters)
        mine, theirs = (decided[1], decided[0]), (o_workers, prompts[o_idx])
        self.guard.record(
            state.iteration,
            none,
            self.refill_prompt,
            self.weights,
            without=theirs if with_estimator else mine,
            with_estimator=mine if with_estimator else theirs,
        )


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

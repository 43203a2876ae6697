"""Scores from a replay of the holdout: the projection error, and the routing it buys.

Projection error: how far each worker's projected departures are from what happened.

BR-H decides against each worker's load projected ``h = 1..H`` iterations ahead; the estimator's
part of that projection is which running requests leave, and when. On worker states sampled from
a replay, every estimator projects the departed load of each worker,
``D_g(h) = sum_i (W_i + h) (1 - P(r_i > h))`` over its running requests (workload ``W_i``), and
is compared with what the replay then did, ``sum_i (W_i + h) 1{r_i <= h}``:

- ``proj_error``: the ``gamma^h``-weighted mean over ``h`` of ``sum_g |error_g(h)|``, over the
  state's total load (a share of the load, so traces compare);
- ``proj_error_margin``: the same after removing each ``h``'s mean error over the workers, the
  part that moves margins (an error every worker shares leaves BR-H's choices unchanged).

The states come from one replay (``router/lab/runner.py``) of the requests under a prediction-free
``brh`` (so no estimator shapes the states it is judged on); the :class:`StateSampler` wrapped
around that policy hands every completion to each estimator as BR-H would and, every
``every``-th routing call, asks each for its curves of the running requests.

Replay ratio (``replay_ratio``): the steady-state mean imbalance of ``brh`` with the estimator
over that of the same replay without prediction: the A/B's own measure, on replays of the
holdout's requests (a score of the estimator in the router, not of its accuracy). By default the
router runs without its do-no-harm guard: on replays this short the guarded router stands aside
for most estimators, and every ratio comes out 1 whatever the estimator is worth.

Twin ratio (``twin_ratio``): the decode group's twin's paired test (``router/lab/twin/``) on
the holdout, with each estimator: ``twin_windows`` evenly spaced, overlapping windows of the
twin's block length (``8 G B`` requests), each replayed under every blend weight, paired with
``w = 0``, and judged by the twin's own rule (the upper end of the interval widened by
``sqrt(overlap)`` below ``exp(-margin)``: ``router/lab/twin/prior_measure.measure_prior``, what
``train`` measures the prior with). The score is the geometric mean over the windows of the
ratio of the imbalance at the weight the test settles on to that without prediction (1 where it
keeps ``w = 0``): what the default BR-H makes of the estimator on these requests. ``twin_weight``
is that weight, ``twin_upper`` the upper end of its interval (below 1 when the twin found it
significantly better). The holdout is evidence the model never saw, like the A/B's replayed
half; the twin run online over a holdout this short (a few thousand requests) would reach fewer
than the 6 blocks it needs to decide and only quote the model's prior, which was measured on
other requests (on Azure it kept ``w = 0`` where the A/B's later half gains 27%:
docs/results.md). A model carrying a prior for this group shape has its prior pooled with the
holdout's test by inverse variance (:func:`pooled_verdict`; ``twin_from_prior`` is the prior's
share of the pooled precision): a holdout of a block or two rarely resolves a gain alone, and
the prior, measured on other requests the model never saw, is independent evidence. Where the
holdout holds less than one block, the ratio and bound are the prior's (``twin_from_prior`` 1).

Like the A/B harness, the requests are replayed in ``repeats`` evenly spaced windows of half of
them each (one replay varies a lot from window to window): the states are sampled in every
window, and the replay ratio is the median over the windows.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletedBatch, CompletionEstimator, Fitting, RunningBatch
from balanceroute.router.lab.ab import replay_windows
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, replay
from balanceroute.router.lab.twin.config import TwinConfig
from balanceroute.router.lab.twin.prior import DEFAULT_PRIOR_WINDOWS, PriorConfig
from balanceroute.router.lab.twin.prior_measure import measure_prior
from balanceroute.router.lab.twin.prior_start import prior_start
from balanceroute.router.policies.policy import Policy, RunContext
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.router.policies.state import Admissions, RouterState
from balanceroute.training.decision import DEFAULT_SLOTS, lookahead_weights

STATE_ROUTER = "brh:none"
WINDOW_FRACTION = 0.5  # each replayed window holds half of the requests, as in the A/B study


@dataclass(frozen=True, slots=True)
class ReplayScoreConfig:
    """The replay the scores come from (the group, saturated or at a load), and how many
    states the projection error samples."""

    workers: int = field(default=8, metadata={"help": "workers G of the sampling replay"})
    slots: int = field(
        default=DEFAULT_SLOTS, metadata={"help": "slots B per worker of the sampling replay"}
    )
    load: float | None = field(
        default=None, metadata={"help": "offered load (x capacity); None: saturated"}
    )
    repeats: int = field(
        default=3, metadata={"help": "windows replayed, half of the requests each, as in an A/B"}
    )
    every: int = field(default=10, metadata={"help": "routing calls between sampled states"})
    max_states: int = field(default=300, metadata={"help": "sampled states at most"})
    twin: bool = field(
        default=True,
        metadata={
            "help": "twin_ratio: the decode twin's paired test on the holdout (windows of its "
            "block length, 8 G B requests) under each estimator, at the blend weight it settles on"
        },
    )
    twin_windows: int = field(
        default=DEFAULT_PRIOR_WINDOWS,
        metadata={"help": "overlapping windows of the holdout the twin's paired test replays"},
    )
    guard: bool = field(
        default=False,
        metadata={
            "help": "replay ratio with BR-H's do-no-harm guard (off: the estimator's own value; "
            "on: what the guarded default makes of it)"
        },
    )

    def __post_init__(self) -> None:
        checks = [
            (self.workers >= 1, f"workers must be >= 1, got {self.workers}"),
            (self.slots >= 1, f"slots must be >= 1, got {self.slots}"),
            (self.load is None or self.load > 0, f"load must be > 0, got {self.load}"),
            (self.repeats >= 1, f"repeats must be >= 1, got {self.repeats}"),
            (self.every >= 1, f"every must be >= 1, got {self.every}"),
            (self.max_states >= 1, f"max_states must be >= 1, got {self.max_states}"),
            (self.twin_windows >= 2, f"twin_windows must be >= 2, got {self.twin_windows}"),
        ]
        for ok, msg in checks:
            if not ok:
                raise UserError(f"replay scores: {msg}")

    def spec(self, horizon: int) -> ReplaySpec:
        """The replay: ``brh`` looking ``horizon`` ahead, without prediction (the estimator
        given to the replay replaces it; guarded only with ``guard``), on this group,
        saturated or at ``load``."""
        options = f"horizon={int(horizon)};guard={str(self.guard).lower()};twin=false"
        return ReplaySpec(
            router=RouterSpec.parse(f"{STATE_ROUTER}{{{options}}}"),
            workers=self.workers,
            slots=self.slots,
            prefill=PrefillConfig(saturate=self.load is None),
            load=self.load,
        )


@dataclass(slots=True)
class SampledState:
    """One sampled worker state and every estimator's projected departures ``(G, H+1)``."""

    iteration: int
    position: np.ndarray
    worker: np.ndarray
    workload: np.ndarray
    departed: dict[str, np.ndarray]


def departed_load(
    workload: np.ndarray, worker: np.ndarray, survival: np.ndarray, workers: int
) -> np.ndarray:
    """Expected departed load per worker ``(G, H+1)``: ``sum_i (W_i + h) (1 - S_i(h))``."""
    h = np.arange(survival.shape[1], dtype=np.float64)
    gone = (workload[:, None] + h[None, :]) * (1.0 - survival)
    out = np.zeros((workers, survival.shape[1]))
    np.add.at(out, worker, gone)
    return out


class StateSampler(Policy):
    """Routes like the wrapped policy; feeds completions to the estimators and samples states."""

    def __init__(
        self,
        inner: Policy,
        estimators: dict[str, CompletionEstimator],
        horizon: int,
        every: int,
        max_states: int,
    ) -> None:
        self.inner = inner
        self.name = inner.name
        self.estimators = estimators
        self.horizon = horizon
        self.every = max(int(every), 1)
        self.max_states = max_states

    def reset(self, ctx: RunContext) -> None:
        super().reset(ctx)
        self.inner.reset(ctx)
        self.maximal = self.inner.maximal
        self.calls = 0
        self.states: list[SampledState] = []

    def route(self, state: RouterState) -> Admissions:
        self.calls += 1
        if self.calls % self.every == 0 and len(self.states) < self.max_states:
            self._sample(state)
        return self.inner.route(state)

    def _sample(self, state: RouterState) -> None:
        run = state.running()
        if run.size == 0:
            return
        table = state.requests
        batch = RunningBatch(
            prompt_tokens=run.prompt_tokens,
            age=run.age,
            prompt_key=table.prompt_key[run.position],
            request_index=table.trace_index[run.position],
            time_s=state.time_s,
        )
        h = self.horizon
        workload = run.workload.astype(np.float64)
        departed = {}
        for kind, est in self.estimators.items():
            surv = est.predict(batch, survival=True).survival[:, : h + 1]
            departed[kind] = departed_load(workload, run.worker, surv, state.workers)
        self.states.append(
            SampledState(
                state.iteration, run.position.copy(), run.worker.copy(), workload, departed
            )
        )

    def on_complete(self, positions, output_tokens, finish_s, iteration) -> None:
        self.inner.on_complete(positions, output_tokens, finish_s, iteration)
        done = CompletedBatch.from_positions(self.ctx.requests, positions, output_tokens, finish_s)
        for est in self.estimators.values():
            if est.learns_online:
                est.observe(done)

    def run_stats(self) -> dict[str, Any]:
        return self.inner.run_stats()

    def describe(self) -> dict[str, Any]:
        return self.inner.describe()


def state_errors(
    departed: np.ndarray, actual: np.ndarray, total_load: float, weights: np.ndarray
) -> tuple[float, float]:
    """``(proj_error, proj_error_margin)`` of one state (see the module docstring)."""
    err = (departed - actual)[:, 1:]
    margin = err - err.mean(axis=0, keepdims=True)
    scale = max(total_load, 1.0)
    return (
        float(np.abs(err).sum(axis=0) @ weights / scale),
        float(np.abs(margin).sum(axis=0) @ weights / scale),
    )


def replay_scores(
    estimators: dict[str, CompletionEstimator],
    requests: pd.DataFrame,
    gamma: float,
    horizon: int,
    cfg: ReplayScoreConfig | None = None,
) -> dict[str, dict[str, float]]:
    """``proj_error``, ``proj_error_margin`` (with ``proj_states`` sampled) and
    ``replay_ratio`` of every estimator, from replays of ``cfg.repeats`` windows of
    ``requests`` (as the A/B harness cuts them); the estimators are copied for every replay, so
    the originals learn nothing. The replay ratio is the median over the windows."""
    cfg = cfg or ReplayScoreConfig()
    sums = {k: np.zeros(2) for k in estimators}
    ratios: dict[str, list[float]] = {k: [] for k in estimators}
    states = 0
    for start, stop in replay_windows(len(requests), cfg.repeats, WINDOW_FRACTION):
        part = requests.iloc[start:stop].reset_index(drop=True)
        part["arrival_s"] = part["arrival_s"] - part["arrival_s"].iloc[0]
        errors, n, base = projection_errors(estimators, part, gamma, horizon, cfg)
        states += n
        for kind, est in estimators.items():
            sums[kind] += errors[kind]
            _, summary = replay(
                part, cfg.spec(horizon), estimator=copy.deepcopy(est), record_loads=False
            )
            steady = summary["steady_mean_imbalance"]
            if steady is not None and base:  # None: the pool never waited (a window too small)
                ratios[kind].append(steady / base)
    twin = twin_scores(estimators, requests, cfg) if cfg.twin else {}
    return {
        k: {
            **twin.get(k, {}),
            "proj_error": float(sums[k][0] / max(states, 1)),
            "proj_error_margin": float(sums[k][1] / max(states, 1)),
            "proj_states": states,
            "replay_ratio": float(np.median(ratios[k])) if ratios[k] else float("nan"),
        }
        for k in estimators
    }


def twin_scores(
    estimators: dict[str, CompletionEstimator],
    requests: pd.DataFrame,
    cfg: ReplayScoreConfig,
) -> dict[str, dict[str, float]]:
    """``twin_ratio``, ``twin_weight`` and ``twin_upper`` of every estimator: the twin's paired
    test on ``requests`` (``cfg.twin_windows`` overlapping windows of its block length, each
    candidate weight against ``w = 0``, its rule at its level and margin), pooled with the
    model's prior for the group when it carries one (two independent measurements of the same
    gain: :func:`pooled_verdict`); where ``requests`` hold less than one block, the prior alone
    (copies of the estimators; the replays without prediction are shared)."""
    shape = PriorConfig(cfg.workers, cfg.slots, cfg.load, cfg.twin_windows)
    margin = TwinConfig().margin
    baseline: dict = {}
    out = {}
    for kind, est in estimators.items():
        if est.fitting is Fitting.NONE or not est.deployable:
            out[kind] = {**NO_TWIN}
            continue
        verdict = measure_prior(copy.deepcopy(est), requests, shape, baseline=baseline)
        start = prior_start(est, cfg.workers, cfg.slots, cfg.load)
        prior = start.stats if start is not None and start.test is not None else None
        if verdict.windows > 0 and prior is None:
            out[kind] = twin_verdict(
                verdict.start_weight, verdict.candidates, verdict.mean_log_ratio, verdict.upper
            )
        elif prior is None:
            out[kind] = {**NO_TWIN}
        elif verdict.windows == 0:  # fewer requests than a block: the prior's evidence alone
            out[kind] = {
                **twin_verdict(
                    prior["twin_prior_weight"],
                    start.test.candidates,
                    prior["twin_prior_mean_log_ratios"],
                    prior["twin_prior_upper"],
                ),
                "twin_from_prior": 1.0,
            }
        else:
            out[kind] = pooled_verdict(
                verdict.candidates,
                (verdict.mean_log_ratio, verdict.se),
                (prior["twin_prior_mean_log_ratios"], prior["twin_prior_se"]),
                margin,
            )
    return out


def pooled_verdict(
    candidates: Sequence[float],
    holdout: tuple[Sequence[float], Sequence[float]],
    prior: tuple[Sequence[float], Sequence[float]],
    margin: float,
    z: float = 2.0,
) -> dict[str, float]:
    """The twin's rule on two independent measurements of each candidate's mean log ratio to
    ``w = 0`` (the holdout's test and the model's prior, each ``(means, standard errors)``),
    pooled by inverse variance: among the candidates whose pooled upper end ``exp(m + z se)``
    is below ``exp(-margin)``, the largest gain, else ``w = 0``. ``twin_from_prior`` is the
    prior's share of the pooled precision at the chosen weight. A short holdout alone rarely
    resolves a gain (one or two blocks); with the prior it adds what it saw rather than
    overruling evidence ten times its size."""
    means, ses, shares = [], [], []
    for j in range(len(candidates)):
        precisions = [1.0 / s[j] ** 2 if s[j] > 0 else 0.0 for s in (holdout[1], prior[1])]
        total = sum(precisions)
        if total == 0.0:  # w = 0 itself, or no evidence either way
            means.append(0.0)
            ses.append(0.0)
            shares.append(0.0)
            continue
        m = (holdout[0][j] * precisions[0] + prior[0][j] * precisions[1]) / total
        means.append(m)
        ses.append(1.0 / np.sqrt(total))
        shares.append(precisions[1] / total)
    uppers = [
        float(np.exp(m + z * se)) if se > 0 else 1.0 for m, se in zip(means, ses, strict=True)
    ]
    resolved = [j for j, u in enumerate(uppers) if u < np.exp(-margin)]
    if not resolved:
        return {**NO_TWIN}
    best = min(resolved, key=lambda j: means[j])
    return {
        "twin_ratio": float(np.exp(means[best])),
        "twin_weight": float(candidates[best]),
        "twin_upper": uppers[best],
        "twin_from_prior": float(shares[best]),
    }


NO_TWIN = {"twin_ratio": 1.0, "twin_weight": 0.0, "twin_upper": 1.0, "twin_from_prior": 0.0}


def twin_verdict(
    weight: float, candidates: Sequence[float], mean_log: Sequence[float], upper: Sequence[float]
) -> dict[str, float]:
    """The scores at the weight a test settled on: the geometric-mean ratio to ``w = 0`` and
    the upper end of its interval there (1 and 1 at ``w = 0``)."""
    j = list(candidates).index(weight)
    if j == 0:
        return {**NO_TWIN}
    return {
        "twin_ratio": float(np.exp(mean_log[j])),
        "twin_weight": float(weight),
        "twin_upper": float(upper[j]),
        "twin_from_prior": 0.0,
    }


def projection_errors(
    estimators: dict[str, CompletionEstimator],
    requests: pd.DataFrame,
    gamma: float,
    horizon: int,
    cfg: ReplayScoreConfig,
) -> tuple[dict[str, np.ndarray], int, float | None]:
    """Summed ``(proj_error, proj_error_margin)`` of every estimator (copies) over the states
    sampled from the prediction-free replay of ``requests``, how many, and that replay's
    steady imbalance (None if the pool never waited)."""
    passengers = {k: copy.deepcopy(e) for k, e in estimators.items()}
    sampler: list[StateSampler] = []
    per_window = max(cfg.max_states // cfg.repeats, 1)

    def wrap(policy: Policy) -> Policy:
        sampler.append(StateSampler(policy, passengers, horizon, cfg.every, per_window))
        return sampler[0]

    result, summary = replay(requests, cfg.spec(horizon), wrap=wrap, record_loads=False)
    weights = lookahead_weights(horizon, gamma)
    hs = np.arange(horizon + 1)
    finish = result.admit_iter + result.output_tokens
    sums = {k: np.zeros(2) for k in estimators}
    states = sampler[0].states
    for st in states:
        remaining = finish[st.position] - st.iteration
        gone = (remaining[:, None] <= hs[None, :]) * (st.workload[:, None] + hs[None, :])
        actual = np.zeros((result.config.workers, horizon + 1))
        np.add.at(actual, st.worker, gone)
        for kind, dep in st.departed.items():
            sums[kind] += state_errors(dep, actual, float(st.workload.sum()), weights)
    return sums, len(states), summary["steady_mean_imbalance"]

"""Paired A/B replay of routers and estimators on the same requests and releases.

Every arm replays the same windows of the same trace with the same prefill releases; repeats
are windows of the replayed part (or, for one repeat, all of it). When an arm's estimator must
be trained on the fly, the trace's earlier ``train_fraction`` trains it (time-ordered, no
leakage) and every arm replays only the later part. Tasks (arm x G x repeat) run in parallel
processes with joblib (or on a Dask cluster); each gets its own copy of any estimator, and
results depend only on the seeds, never on the number of jobs.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import sys
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.features.split import time_split
from balanceroute.predict.base import CompletionEstimator, Fitting
from balanceroute.predict.factory import build_estimator
from balanceroute.predict.model_store import registered_version
from balanceroute.predict.registry import estimator_class
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.paired import HIGHER_IS_BETTER, paired_ratio
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.runner import ReplaySpec, released_requests, replay
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.driver import twin_managed
from balanceroute.router.lab.twin.prior_start import prior_start
from balanceroute.router.lab.twin.schedule import scheduled_weight, twin_schedule
from balanceroute.router.lab.twin.warmup import warm_start
from balanceroute.router.policies.specs import RouterSpec

TRAJECTORY_WINDOW = 1500
DIST_SAMPLE = 4000


@dataclass(frozen=True)
class ABConfig:
    """What to compare and how."""

    arms: tuple[RouterSpec, ...]
    workers: tuple[int, ...] = (8,)
    slots: int = 64
    repeats: int = 5
    window_fraction: float = 0.5
    train_fraction: float = 0.3
    seed: int = 0
    saturate: bool = False
    rate_scale: float = 1.0
    load: float | None = None
    cost: CostModel = field(default_factory=CostModel)
    horizon: int = DEFAULT_HORIZON
    reference: str | None = None
    twin: TwinConfig = field(default_factory=TwinConfig)
    window_requests: int | None = None  # repeats windows of this many requests (else fraction)
    noise_floor: bool = False  # also replay the reference on windows shifted by one request

    def reference_arm(self) -> str:
        if self.reference is not None:
            if self.reference not in [a.label for a in self.arms]:
                raise UserError(f"reference arm '{self.reference}' is not one of the arms")
            return self.reference
        for a in self.arms:
            if a.label == "count-jsq":
                return a.label
        return self.arms[0].label


NOISE_FLOOR = "noise floor"  # the reference arm on windows shifted by one request
DEFAULT_WINDOWS = 30
MIN_WINDOW_REQUESTS = 400
WINDOW_SLOT_MULTIPLE = 4  # a window holds this many group-fulls of requests (a steady state)


def default_window_requests(workers: tuple[int, ...], slots: int) -> int:
    """Requests per window: enough to fill the largest group several times over."""
    return max(MIN_WINDOW_REQUESTS, WINDOW_SLOT_MULTIPLE * max(workers) * slots)


@dataclass
class Task:
    arm: RouterSpec
    workers: int
    repeat: int
    start: int
    stop: int
    keep_traces: bool
    noise: bool = False
    twin: tuple[float, dict[str, Any]] | None = None  # the weight a twin chose before the window


def replay_windows(
    n: int, repeats: int, fraction: float, window_requests: int | None = None
) -> list[tuple[int, int]]:
    """``repeats`` evenly spaced windows over ``n`` requests (all of them for one repeat), each
    ``window_requests`` long (leaving room for a shift by one) or a ``fraction`` of ``n``."""
    if repeats < 1:
        raise UserError(f"--repeats must be at least 1, got {repeats}")
    if window_requests is not None:
        if n < 3:
            raise UserError(f"need at least 3 requests to replay windows, got {n}")
        size = max(2, min(window_requests, n - 1))
        starts = np.round(np.linspace(0, n - size - 1, repeats)).astype(int)
        return [(int(s), int(s) + size) for s in starts]
    if repeats == 1:
        return [(0, n)]
    size = max(1, int(n * fraction))
    starts = np.round(np.linspace(0, n - size, repeats)).astype(int)
    return [(int(s), int(s) + size) for s in starts]


def prepare(
    frame: pd.DataFrame, cfg: ABConfig, progress=None
) -> tuple[pd.DataFrame, dict[str, CompletionEstimator], dict[str, Any]]:
    """Split off training history if an arm needs it and build every arm's estimator (those
    that read the replayed requests are built per task, on each task's window)."""
    info: dict[str, Any] = {"trained_on_the_fly": {}, "loaded_from_registry": {}}
    history = None
    replay_frame = frame
    if any(a.estimator is not None and a.estimator.needs_history for a in cfg.arms):
        history, replay_frame = time_split(frame, cfg.train_fraction, rebase_tail=True)
        info["history_requests"] = len(history)
    info["replay_requests"] = len(replay_frame)
    fitted: dict[str, CompletionEstimator] = {}
    cache: dict[tuple[str, str | None], CompletionEstimator] = {}
    for arm in cfg.arms:
        spec = arm.estimator
        if spec is None or spec.fitting is Fitting.TRACE:
            continue
        key = (spec.kind, spec.model_uri)
        if key not in cache:
            if progress and (spec.model_uri or spec.fitting is not Fitting.NONE):
                what = f"loading {spec.model_uri}" if spec.model_uri else "training"
                progress(f"{what} estimator '{spec.kind}'")
            cache[key] = build_estimator(
                spec, history=history, replay=replay_frame, horizon=_horizon(arm, cfg)
            )
        fitted[arm.label] = cache[key]
        if spec.model_uri:
            info["loaded_from_registry"][arm.label] = {
                "model_uri": spec.model_uri,
                "version": registered_version(spec.model_uri),
            }
        elif spec.needs_history:
            info["trained_on_the_fly"][arm.label] = {"requests": len(history)}
    return replay_frame, fitted, info


def _horizon(arm: RouterSpec, cfg: ABConfig) -> int:
    """The horizon an arm's estimator predicts for: its own option, else the run's (at least 1)."""
    return max(1, cfg.horizon if arm.horizon is None else arm.horizon)


def run_task(
    task: Task,
    replay_frame: pd.DataFrame,
    estimator: CompletionEstimator | None,
    cfg: ABConfig,
) -> dict[str, Any]:
    """Replay one (arm, G, repeat) and return its summary and plot material."""
    frame = replay_frame.iloc[task.start : task.stop].reset_index(drop=True)
    frame["arrival_s"] = frame["arrival_s"] - frame["arrival_s"].iloc[0]
    arm = task.arm
    est = copy.deepcopy(estimator)
    spec = arm.estimator
    if spec is not None and spec.fitting is Fitting.TRACE:
        if "seed" in {f.name for f in dataclasses.fields(estimator_class(spec.kind).Params)}:
            spec = replace(spec, params={**spec.params, "seed": cfg.seed + task.repeat})
        est = build_estimator(spec, replay=frame, horizon=_horizon(arm, cfg))
    replay_spec = ReplaySpec(
        router=arm,
        workers=task.workers,
        slots=cfg.slots,
        seed=cfg.seed + task.repeat,
        cost=cfg.cost,
        prefill=PrefillConfig(saturate=cfg.saturate, rate_scale=cfg.rate_scale),
        load=cfg.load,
    )
    released, scale = released_requests(frame, replay_spec)
    result, summary = replay(
        frame,
        replay_spec,
        estimator=est,
        released=released,
        record_loads=task.keep_traces,
        scheduled=task.twin,
    )
    summary["config"]["prefill"]["rate_scale"] = scale
    out: dict[str, Any] = {
        "arm": NOISE_FLOOR if task.noise else arm.label,
        "workers": task.workers,
        "repeat": task.repeat,
        "summary": summary,
        "releases_sha256": hashlib.sha256(
            np.ascontiguousarray(released.release_s).tobytes()
            + np.ascontiguousarray(released.prompt_tokens).tobytes()
            + np.ascontiguousarray(released.output_tokens).tobytes()
        ).hexdigest(),
    }
    if task.keep_traces:
        steady = result.waiting > 0
        imb = result.imbalance[steady] if steady.any() else result.imbalance
        step = max(1, imb.size // DIST_SAMPLE)
        out["imbalance_sample"] = imb[::step].tolist()
        idx = np.flatnonzero(steady) if steady.any() else np.arange(result.iterations)
        mid = int(idx[len(idx) // 2]) if idx.size else 0
        lo = max(0, min(mid - TRAJECTORY_WINDOW // 2, result.iterations - TRAJECTORY_WINDOW))
        out["trajectory"] = {
            "start": lo,
            "loads": result.loads[lo : lo + TRAJECTORY_WINDOW].tolist(),
        }
    return out


DASK_CONNECT_TIMEOUT_S = 10


def twin_schedules(
    replay_frame: pd.DataFrame,
    fitted: dict[str, CompletionEstimator],
    cfg: ABConfig,
    jobs: int,
    progress=None,
    history: pd.DataFrame | None = None,
) -> dict[tuple[str, int], tuple[list, dict[str, Any]]]:
    """For every twin-managed arm and G: the twin run over the replayed requests in arrival
    order (each window then routes with the weight decided on the requests before it), after
    a warm-up on ``history`` (the training portion) where the arm's estimator trains on it."""
    from joblib import Parallel, delayed

    todo = []
    for arm in cfg.arms:
        if not twin_managed(arm.build_policy(fitted.get(arm.label))):
            continue
        for g in cfg.workers:
            todo.append((arm, g))
    if not todo:
        return {}
    if progress:
        progress(f"twin: deciding blend weights on the past of every window ({len(todo)} runs)")

    def one(arm: RouterSpec, g: int):
        spec = ReplaySpec(
            router=arm,
            workers=g,
            slots=cfg.slots,
            seed=cfg.seed,
            cost=cfg.cost,
            prefill=PrefillConfig(saturate=cfg.saturate, rate_scale=cfg.rate_scale),
            load=cfg.load,
        )
        released, _ = released_requests(replay_frame, spec)
        group = TwinGroup(arm, g, cfg.slots, cfg.cost, cfg.seed)
        warm = warm_start(history, spec, cfg.twin, _horizon(arm, cfg))
        # a model carrying the twin's prior (measured on its holdout at train time) starts
        # the test there when it was measured on this group's shape
        prior = None
        if warm is None:
            load = None if cfg.saturate else cfg.load
            prior = prior_start(fitted.get(arm.label), g, cfg.slots, load, cfg.twin)
        test = warm.test if warm is not None else None if prior is None else prior.test
        entries, stats = twin_schedule(
            group, copy.deepcopy(fitted.get(arm.label)), released, cfg.twin, warm=test
        )
        extra = warm.stats() if warm is not None else {}
        if prior is not None:
            extra = {**prior.stats, "twin_prior_note": prior.note}
        return entries, {**stats, **extra}

    done = Parallel(n_jobs=jobs, verbose=0)(delayed(one)(a, g) for a, g in todo)
    return {(a.label, g): r for (a, g), r in zip(todo, done, strict=True)}


def run_ab(
    frame: pd.DataFrame,
    cfg: ABConfig,
    *,
    jobs: int = 1,
    dask_scheduler: str | None = None,
    progress=None,
) -> dict[str, Any]:
    """Run every (arm, G, repeat) task; returns raw task results and preparation info."""
    from joblib import Parallel, delayed, parallel_config

    replay_frame, fitted, info = prepare(frame, cfg, progress)
    windows = replay_windows(
        len(replay_frame), cfg.repeats, cfg.window_fraction, cfg.window_requests
    )
    tasks = [
        Task(arm, g, r, start, stop, keep_traces=(r == 0))
        for g in cfg.workers
        for r, (start, stop) in enumerate(windows)
        for arm in cfg.arms
    ]
    if cfg.noise_floor:
        ref = next(a for a in cfg.arms if a.label == cfg.reference_arm())
        n = len(replay_frame)
        tasks += [
            Task(ref, g, r, start + 1, min(stop + 1, n), keep_traces=False, noise=True)
            for g in cfg.workers
            for r, (start, stop) in enumerate(windows)
        ]
    history = None
    if "history_requests" in info:  # the training portion, for the twin's warm-up
        history, _ = time_split(frame, cfg.train_fraction, rebase_tail=True)
    schedules = twin_schedules(replay_frame, fitted, cfg, jobs, progress, history)
    for t in tasks:
        if (t.arm.label, t.workers) in schedules:
            t.twin = scheduled_weight(
                schedules[(t.arm.label, t.workers)][0], t.start, cfg.twin.start_weight
            )
    info["twin"] = {f"{a} G={g}": st for (a, g), (_, st) in schedules.items()}
    for key, st in info["twin"].items():
        if progress and "twin_prior_note" in st:
            progress(f"{key}: {st['twin_prior_note']}")
    if progress:
        progress(
            f"replaying {len(tasks)} tasks ({len(cfg.arms)} arms x {len(cfg.workers)} G x "
            f"{len(windows)} repeats) with {jobs} job(s)"
        )
    calls = (delayed(run_task)(t, replay_frame, fitted.get(t.arm.label), cfg) for t in tasks)
    if dask_scheduler:
        from distributed import Client

        try:
            client = Client(dask_scheduler, timeout=DASK_CONNECT_TIMEOUT_S)
        except (OSError, TimeoutError, ValueError) as exc:
            raise UserError(
                f"cannot reach the Dask scheduler at {dask_scheduler} ({type(exc).__name__}: "
                f"{str(exc).splitlines()[0] if str(exc) else 'no answer'})"
            ) from None
        with client, parallel_config(backend="dask"):
            results = Parallel(verbose=0)(calls)
    else:
        results = Parallel(n_jobs=jobs, verbose=0)(calls)
    info["windows"] = windows
    info["overlap"] = overlap_of(windows, len(replay_frame))
    return {"tasks": results, "info": info}


def overlap_of(windows: list[tuple[int, int]], n: int) -> float:
    """How many times over the windows cover the ``n`` replayed requests (at least 1)."""
    covered = sum(stop - start for start, stop in windows)
    return max(1.0, covered / max(1, n))


def bootstrap_mean_ci(
    values: np.ndarray, seed: int = 0, n: int = 2000, level: float = 0.95
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap interval of the mean over repeats."""
    values = np.asarray(values, dtype=np.float64)
    point = float(values.mean())
    if values.size < 2:
        return point, point, point
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, (n, values.size))].mean(axis=1)
    lo, hi = np.quantile(means, [(1 - level) / 2, 1 - (1 - level) / 2])
    return point, float(min(lo, point)), float(max(hi, point))


METRICS = (
    "steady_mean_imbalance",
    "mean_imbalance",
    "tpot_p95_ms",
    "throughput_tok_s",
    "queue_delay_p99_s",
    "max_queue_delay_s",
    "max_overtaken",
    "router_step_us_p50",
)


# per window besides the metrics: its size, and the blend weight a twin-managed arm routed with
REPEAT_KEYS = ("iterations", "completed_requests", "twin_weight")


def aggregate(raw: dict[str, Any], cfg: ABConfig) -> dict[str, Any]:
    """Per arm and G: the mean of every summary key over repeats, intervals and paired ratios."""
    ref = cfg.reference_arm()
    by: dict[tuple[str, int], list[dict]] = {}
    for t in raw["tasks"]:
        by.setdefault((t["arm"], t["workers"]), []).append(t)
    for v in by.values():
        v.sort(key=lambda t: t["repeat"])
    arms: dict[str, Any] = {}
    overlap = raw["info"].get("overlap", 1.0)
    labels = [a.label for a in cfg.arms] + ([NOISE_FLOOR] if cfg.noise_floor else [])
    for label in labels:
        per_g = {}
        for g in cfg.workers:
            runs = by[(label, g)]
            refs = by[(ref, g)]
            per_g[g] = _arm_stats(runs, refs, cfg.seed)
            if cfg.window_requests is not None:
                per_g[g]["paired"] = paired_stats(runs, refs, overlap)
        first = per_g[cfg.workers[0]]
        entry = {**first}
        if len(cfg.workers) > 1:
            entry["by_workers"] = {str(g): per_g[g] for g in cfg.workers}
        arms[label] = entry
    out: dict[str, Any] = {"arms": {k: v for k, v in arms.items() if k != NOISE_FLOOR}}
    out["reference"] = ref
    if NOISE_FLOOR in arms:
        out["noise_floor"] = arms[NOISE_FLOOR]
    return out


def paired_stats(runs: list[dict], refs: list[dict], overlap: float) -> dict[str, Any]:
    """Per headline metric: the paired ratio to the reference over windows (95% t-interval on
    log ratios) and its verdict."""
    out = {}
    for m in METRICS:
        if m == "router_step_us_p50":
            continue
        vals = np.array([_num(r["summary"].get(m)) for r in runs])
        base = np.array([_num(r["summary"].get(m)) for r in refs])
        pr = paired_ratio(vals, base, overlap=overlap, higher_is_better=m in HIGHER_IS_BETTER)
        if pr is not None:
            out[m] = pr.as_dict()
    return out


def _arm_stats(runs: list[dict], refs: list[dict], seed: int) -> dict[str, Any]:
    summaries = [r["summary"] for r in runs]
    out: dict[str, Any] = {}
    for key, _value in summaries[0].items():
        if key == "config":
            continue
        vals = [s[key] for s in summaries]
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in vals):
            out[key] = float(np.mean(vals))
        elif all(v is None for v in vals):
            out[key] = None
    intervals, ratios = {}, {}
    for m in METRICS:
        vals = np.array([_num(s.get(m)) for s in summaries])
        base = np.array([_num(r["summary"].get(m)) for r in refs])
        if np.isnan(vals).any():
            continue
        intervals[m] = bootstrap_mean_ci(vals, seed)
        ok = ~np.isnan(base) & (base != 0)
        if ok.all():
            ratios[m] = bootstrap_mean_ci(vals / base, seed)
    out["interval"] = {m: [lo, hi] for m, (_, lo, hi) in intervals.items()}
    out["ratio_to_reference"] = {
        m: {"mean": p, "low": lo, "high": hi} for m, (p, lo, hi) in ratios.items()
    }
    out["repeats"] = [
        {k: s.get(k) for k in (*METRICS, *REPEAT_KEYS)} for s in summaries
    ]
    out["releases_sha256"] = [r["releases_sha256"] for r in runs]
    out["config"] = summaries[0]["config"]
    return out


def _num(v: Any) -> float:
    return float("nan") if v is None else float(v)


def progress_printer(message: str) -> None:
    print(f"ab: {message}", file=sys.stderr, flush=True)

"""``balanceroute pipeline``: one learning cycle, from the completion log to the serving fleet.

Steps, each logged on stderr with its UTC time and duration:

1. ``champion``: read the registered champion and the end of the log window it was fitted on
   (its ``pipeline.window_end_epoch_s`` tag; read-only).
2. ``window``: the log's recent window (:mod:`balanceroute.training.log_window`). Fewer than
   ``min_new_rows`` requests newer than the champion's window: **nothing to do**.
3. ``fit``: every candidate kind fitted on the window's earlier part and scored on its latest
   slice, requests newer than anything the champion saw and that no candidate copy saw (at most
   ``holdout_fraction`` of the window); then refitted on the whole window, saved locally.
4. ``score``: the champion scored on the same slice; the best candidate must have a lower Brier.
5. ``twin``: the twin's prior of the best candidate for the group's shape, measured on that
   slice by the copy that never saw it (:mod:`balanceroute.training.twin_judge`).
6. ``preflight`` (when promoting): every configured gateway and service is reached.
7. ``register``: the best candidate is registered, with its metrics, its twin prior, its holdout
   Brier and the window's lineage as version tags.
8. ``promote``: its kind's alias, then ``champion`` (or ``challenger`` when it is kept out).
9. ``reload``: every target reloads. A failure restores every alias this cycle moved and asks
   the targets that did reload to reload again, so they serve the old champion.

A failure at any step stops the cycle with the step's name; no alias has moved (or every one
moved is restored). Exit codes (:class:`Outcome` and the errors' ``exit_code``): 0 promoted or
nothing to do, 10 candidate not better, 11 the twin judges it harmful; 2 bad input (the log,
the flags), 3 tracking store, 4 a reload target, 5 any other failed step.
"""

from __future__ import annotations

import contextlib
import enum
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import DEFAULT_MODEL_NAME, error_line, setup_mlflow
from balanceroute.training.champion import promotion, score_champion
from balanceroute.training.evaluate import progress
from balanceroute.training.log_window import WINDOW_END_TAG, LogWindow, not_started, read_window
from balanceroute.training.promote import AliasChange, move_aliases_last_champion, restore
from balanceroute.training.reload_targets import Target, check_reachable, reload
from balanceroute.training.tracking import DEFAULT_ESTIMATORS, DEFAULT_EXPERIMENT
from balanceroute.training.train import (
    TrainConfig,
    Trained,
    fit_candidates,
    log_to_mlflow,
    save_local,
    twin_priors,
)
from balanceroute.training.twin_judge import PRIOR_WINDOWS, prior_configs, twin_verdict

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class Outcome(enum.Enum):
    """How a cycle that ran to its end came out, and its exit code."""

    PROMOTED = ("promoted", 0)
    NOTHING_TO_DO = ("nothing-to-do", 0)
    NOT_BETTER = ("not-better", 10)
    HARMFUL = ("twin-harmful", 11)

    @property
    def label(self) -> str:
        """The outcome's name in the cycle's JSON answer."""
        return self.value[0]

    @property
    def exit_code(self) -> int:
        """The process's exit code for this outcome."""
        return self.value[1]


class StepFailed(UserError):
    """A step of the cycle failed; nothing was promoted. Exit code: the cause's, else 5."""

    exit_code = 5


@dataclass(frozen=True)
class PipelineConfig:
    """One cycle's input, candidates, judge and targets."""

    log: str
    window_rows: int = 20_000
    max_age_s: float | None = None
    min_new_rows: int = 500
    holdout_fraction: float = 0.3
    estimators: tuple[str, ...] = DEFAULT_ESTIMATORS
    horizon: int = DEFAULT_HORIZON
    experiment: str = DEFAULT_EXPERIMENT
    register_as: str = DEFAULT_MODEL_NAME
    group: tuple[int, int] = (8, 32)
    twin_windows: int = PRIOR_WINDOWS
    targets: tuple[Target, ...] = ()
    out: str | None = None

    def __post_init__(self) -> None:
        if not 0.0 < self.holdout_fraction < 1.0:
            raise UserError(f"holdout fraction must be in (0, 1), got {self.holdout_fraction}")
        if self.min_new_rows < 1:
            raise UserError(f"min new rows must be at least 1, got {self.min_new_rows}")
        if not Path(self.log).exists():  # before any step: a typo is one line, exit 2
            raise UserError(f"completion log '{Path(self.log).resolve()}' does not exist")


@dataclass
class CycleResult:
    """What a cycle did: its outcome, why, and the registry's state it left."""

    outcome: Outcome
    why: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """The cycle's JSON answer."""
        return {"outcome": self.outcome.label, "exit_code": self.outcome.exit_code,
                "why": self.why, **self.details}  # fmt: skip


@contextlib.contextmanager
def step(name: str) -> Iterator[None]:
    """Log a step's start and end; turn its failure into a :class:`StepFailed` naming it."""
    t0 = time.perf_counter()
    progress(f"pipeline step {name}: start")
    try:
        yield
    except StepFailed:
        raise
    except Exception as exc:
        code = exc.exit_code if isinstance(exc, UserError) else StepFailed.exit_code
        failed = StepFailed(f"pipeline step '{name}' failed: {error_line(exc)}; champion unchanged")
        failed.exit_code = code
        raise failed from None
    progress(f"pipeline step {name}: done ({time.perf_counter() - t0:.1f}s)")


def current_champion(cfg: PipelineConfig) -> tuple[str | None, float | None]:
    """The champion's version and the end of its log window (None: no champion, no lineage)."""
    setup_mlflow(cfg.experiment)
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        version = client.get_model_version_by_alias(cfg.register_as, "champion")
    except MlflowException as exc:
        if "RESOURCE_DOES_NOT_EXIST" in str(exc.error_code) or "not found" in str(exc).lower():
            return None, None
        raise
    end = version.tags.get(WINDOW_END_TAG)
    return version.version, float(end) if end else None


def train_config(cfg: PipelineConfig, train_fraction: float) -> TrainConfig:
    """The ``train`` configuration of a cycle (one fold: the twin prior on the judge slice)."""
    return TrainConfig(
        horizon=cfg.horizon,
        estimators=cfg.estimators,
        experiment=cfg.experiment,
        register_as=cfg.register_as,
        out=cfg.out,
        train_fraction=train_fraction,
        twin_priors=prior_configs((cfg.group,), cfg.twin_windows),
        prior_folds=1,
    )


def run_cycle(cfg: PipelineConfig) -> CycleResult:
    """One cycle (module docstring); a :class:`StepFailed` names the step that failed."""
    with step("champion"):
        champ_version, champ_end = current_champion(cfg)
    if not_started(cfg.log):
        why = "the completion log has no requests yet (the gateway writes its first part soon)"
        return CycleResult(Outcome.NOTHING_TO_DO, why, {"champion_version": champ_version})
    with step("window"):
        window = read_window(cfg.log, cfg.window_rows, cfg.max_age_s)
        new = window.new_rows(champ_end)
    progress(f"window: {len(window.frame):,} of {window.log_rows:,} logged requests, {new:,} "
             f"newer than champion {champ_version or '(none)'}'s window")  # fmt: skip
    if new < cfg.min_new_rows:
        why = f"{new} requests newer than the champion's window (need {cfg.min_new_rows})"
        return CycleResult(Outcome.NOTHING_TO_DO, why, {"champion_version": champ_version})
    share = min(cfg.holdout_fraction, new / len(window.frame))
    tcfg = train_config(cfg, 1.0 - share)
    with step("fit"):
        done = fit_candidates(tcfg, window.frame)
    with step("score"):
        champion = score_champion(tcfg, done.holdout)
        kind, better, why = promotion(done.metrics, champion, False, done.paired(cfg.horizon))
    with step("twin"):
        files = {kind: done.files[kind]}
        done.priors = twin_priors(tcfg, files, done.holdout, done.history, done.heads)
        verdict = twin_verdict([p.as_dict() for p in done.priors[kind]], *cfg.group)
    progress(f"judge: {kind}: {why}; {verdict.why}")
    outcome = Outcome.PROMOTED
    if not better:
        outcome = Outcome.NOT_BETTER
    elif verdict.harmful:
        outcome, why = Outcome.HARMFUL, verdict.why
    if outcome is Outcome.PROMOTED:
        with step("preflight"):
            for target in cfg.targets:
                check_reachable(target)
    return finish(cfg, tcfg, window, done, kind, outcome, why)


def finish(
    cfg: PipelineConfig,
    tcfg: TrainConfig,
    window: LogWindow,
    done: Trained,
    kind: str,
    outcome: Outcome,
    why: str,
) -> CycleResult:
    """Register the candidate, move its aliases (``champion`` last, if promoted), reload."""
    summary, report = save_local(tcfg, done, window.source())
    with step("register"):
        reg = log_to_mlflow(tcfg, summary, {kind: done.files[kind]}, report,
                            {kind: done.metrics[kind]}, done.out_dir, done.priors,
                            window.lineage())  # fmt: skip
    version = reg["versions"][kind]
    final = "champion" if outcome is Outcome.PROMOTED else "challenger"
    with step("promote"):
        change = move_aliases_last_champion(cfg.register_as, {kind: version, final: version})
    details = {"candidate": kind, "version": version, "aliases": {kind: version, final: version},
               "brier": done.metrics[kind]["brier"], "run_id": reg["run_id"],
               "local_dir": summary["local_dir"]}  # fmt: skip
    if outcome is Outcome.PROMOTED:
        with step("reload"):
            reload_all(cfg.targets, change)
        details["reloaded"] = [t.name for t in cfg.targets]
    progress(f"cycle: {outcome.label}: {kind} version {version} ({why})")
    return CycleResult(outcome, why, details)


def reload_all(targets: tuple[Target, ...], change: AliasChange) -> None:
    """Reload every target; on a failure restore the aliases, reload back those that swapped,
    and raise."""
    done: list[Target] = []
    try:
        for target in targets:
            reload(target)
            progress(f"reloaded {target.name}")
            done.append(target)
    except Exception:
        restore(change)
        progress("reload failed: aliases restored to the previous champion")
        for target in done:
            with contextlib.suppress(Exception):
                reload(target)
                progress(f"reloaded {target.name} back to the previous champion")
        raise


def run_loop(
    cfg: PipelineConfig,
    period_s: float,
    cycle: Callable[[PipelineConfig], CycleResult] = run_cycle,
) -> int:
    """Run ``cycle`` every ``period_s`` until SIGTERM or SIGINT (the running cycle finishes
    first); a failed cycle is logged and the next one runs. Returns 0."""
    stop = threading.Event()
    before = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in STOP_SIGNALS}
    try:
        while not stop.is_set():
            start = time.monotonic()
            try:
                res = cycle(cfg)
                progress(f"cycle done: {res.outcome.label} (exit code {res.outcome.exit_code})")
            except UserError as exc:
                progress(f"cycle failed (exit code {exc.exit_code}): {exc}")
            wait = max(0.0, period_s - (time.monotonic() - start))
            if not stop.is_set():
                progress(f"next cycle in {wait:.0f}s")
            stop.wait(wait)
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    progress("stopped")
    return 0

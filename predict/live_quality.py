"""Live prediction quality: predictions beside outcomes, scored over a sliding window.

The gateway (and any process that admits requests with a deployed estimator) asks the model, at
each admission, for the request's ``p_finish = P(r <= H)`` and ``c = E[min(r, H)]`` (at its age
then, 0 for a request just admitted), remembers it with the model's name and version
(:meth:`LiveQuality.admit`) and, when the request finishes with ``O`` output tokens, writes it
beside the outcome in the completion log (:data:`PREDICTION_COLUMNS`) and scores it
(:meth:`LiveQuality.finish`).

**The outcome** is defined as training's labels are (``training.evaluate``, ``training.metrics``:
``y = remaining <= H`` with ``remaining = O - age`` at the snapshot): for a prediction made at
age ``a`` (the iteration of the request's own decode at which it was asked) with horizon ``H``
(the estimator's, :data:`~balanceroute.features.constants.DEFAULT_HORIZON` = 80 by default), the
realised remaining length is ``r = O - a`` from the request's own token count ``O``, the request
**finished within H** iff ``r <= H`` (one token per iteration), and ``c`` is compared with
``min(r, H)``. Requests that did not finish normally (aborted, failed) are never scored.

``GET /metrics`` exposes, per model (labels ``model``, the registered name or the file's stem,
and ``version``, the registry version or the file's digest; empty when fitted in-process), over
the most recent :data:`DEFAULT_WINDOW` finished requests of that version
(``BALANCEROUTE_QUALITY_WINDOW``; at most :data:`MAX_VERSIONS` versions are kept):

- ``balanceroute_live_brier``: the Brier score of ``p_finish``;
- ``balanceroute_live_calibration_error``: its expected calibration error (15 bins);
- ``balanceroute_live_auc``: its AUC;
- ``balanceroute_live_remaining_error``: the mean absolute error of ``c`` against ``min(r, H)``;
- ``balanceroute_prediction_drift``: live Brier over the Brier the model scored on its training
  holdout's requests at admission, the same population (1: as trained; above 1: worse than when
  it was judged);
- ``balanceroute_live_window_requests``: the finished requests the window holds.

With fewer than :data:`MIN_FINISHED` requests in the window every gauge but the count is NaN;
with one class only (all finished within H, or none) the four gauges of ``p_finish`` are NaN
(the remaining error still shows). The holdout Brier is ``evaluate``'s ``brier_at_admission``
(each holdout request predicted at age 0, as the gauges score; the all-ages ``brier`` differs by
tens of percent: 0.228 against 0.148 at admission for ``exactmatch`` on azure-conv): the version
tag :data:`HOLDOUT_BRIER_TAG` and run metric of a registered version, and the attribute
``holdout_brier_`` of the estimator ``train`` saves (so a ``.joblib`` file carries it too);
:func:`stamp` attaches it, with the name and version, at load. Brier, ECE and AUC are
:mod:`.calibration`'s, as training's.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from collections import OrderedDict, deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletionEstimator, RunningBatch
from balanceroute.predict.calibration import auc, brier_score, expected_calibration_error

log = logging.getLogger("balanceroute.quality")

HOLDOUT_BRIER_TAG = "holdout_brier"
LIVE_LABELS = ("model", "version")
LIVE_BRIER = "balanceroute_live_brier"
LIVE_CALIBRATION_ERROR = "balanceroute_live_calibration_error"
LIVE_AUC = "balanceroute_live_auc"
LIVE_REMAINING_ERROR = "balanceroute_live_remaining_error"
PREDICTION_DRIFT = "balanceroute_prediction_drift"
LIVE_QUALITY_METRICS = (
    LIVE_BRIER,
    LIVE_CALIBRATION_ERROR,
    LIVE_AUC,
    LIVE_REMAINING_ERROR,
    PREDICTION_DRIFT,
)
LIVE_WINDOW = "balanceroute_live_window_requests"
HELP = {
    LIVE_BRIER: "Brier score of P(finish within H) at admission, recent finished requests",
    LIVE_CALIBRATION_ERROR: "expected calibration error of P(finish within H), recent requests",
    LIVE_AUC: "AUC of P(finish within H) at admission, recent finished requests",
    LIVE_REMAINING_ERROR: "mean absolute error of E[min(r, H)] against the realised min(r, H)",
    PREDICTION_DRIFT: "live Brier over the model's training holdout Brier (1: as trained)",
    LIVE_WINDOW: "finished requests in the live quality window",
}
WINDOW_ENV = "BALANCEROUTE_QUALITY_WINDOW"
DEFAULT_WINDOW = 2_000  # a few minutes of a busy group: recent enough to show drift, AUC stable
MIN_FINISHED = 50
MAX_VERSIONS = 4  # windows kept (reloads add versions; the least recently scored goes)
MAX_PENDING = 65_536  # admitted, unfinished predictions kept at most (the oldest go first)
# the completion log's columns for the prediction at admission (null without an estimator)
PREDICTION_COLUMNS = ("predicted_p_finish", "predicted_c", "predicted_horizon", "model_name",
                      "model_version")  # fmt: skip
IDENTITY_ATTRIBUTE = "served_as_"


@dataclass(frozen=True, slots=True)
class ModelIdentity:
    """Which model predicted: its name, version and training holdout Brier (None: unknown)."""

    name: str
    version: str | None = None
    holdout_brier: float | None = None


@dataclass(frozen=True, slots=True)
class Admitted:
    """What the deployed estimator predicted for one request when it was admitted."""

    p_finish: float
    c: float
    horizon: int
    age: int
    model: ModelIdentity

    def columns(self) -> tuple[Any, ...]:
        """Its values of :data:`PREDICTION_COLUMNS`."""
        m = self.model
        return (self.p_finish, self.c, self.horizon, m.name, m.version)

    def outcome(self, output_tokens: int) -> tuple[float, float]:
        """(finished within H, realised ``min(r, H)``) for ``output_tokens`` (module docstring)."""
        r = output_tokens - self.age
        return float(r <= self.horizon), float(min(r, self.horizon))


NO_PREDICTION: tuple[Any, ...] = (None,) * len(PREDICTION_COLUMNS)


def stamp(
    estimator: CompletionEstimator, name: str, version: str | None, metrics: dict | None = None
) -> CompletionEstimator:
    """Attach the loaded version's identity. Its holdout Brier is the registry's run metric
    ``brier_at_admission`` (the population the live gauges score), else the run's ``brier`` (a
    version registered before that metric), else the estimator's own ``holdout_brier_``."""
    metrics = metrics or {}
    brier = metrics.get(
        "brier_at_admission", metrics.get("brier", getattr(estimator, "holdout_brier_", None))
    )
    held = None if brier is None else float(brier)
    setattr(estimator, IDENTITY_ATTRIBUTE, ModelIdentity(name, version, held))
    return estimator


def identity(estimator: CompletionEstimator) -> ModelIdentity:
    """The identity :func:`stamp` attached, else the estimator's kind with no version."""
    found = getattr(estimator, IDENTITY_ATTRIBUTE, None)
    if isinstance(found, ModelIdentity):
        return found
    return ModelIdentity(str(estimator.name), None, getattr(estimator, "holdout_brier_", None))


def deployed(model: CompletionEstimator) -> CompletionEstimator:
    """The model that answers for ``model``: through a swappable handle (``.model``), and behind
    a prediction-service client its local fallback (the same URI's model: asking the service
    again would double its calls)."""
    for attr in ("model", "fallback"):
        inner = getattr(model, attr, None)
        if isinstance(inner, CompletionEstimator):
            model = inner
    return model


def window_size() -> int:
    """``BALANCEROUTE_QUALITY_WINDOW`` or :data:`DEFAULT_WINDOW` (at least 1)."""
    raw = os.environ.get(WINDOW_ENV)
    return max(1, int(raw)) if raw else DEFAULT_WINDOW


def window_scores(
    p: np.ndarray, c: np.ndarray, y: np.ndarray, m: np.ndarray, holdout_brier: float | None,
    min_finished: int = MIN_FINISHED,
) -> dict[str, float]:  # fmt: skip
    """The gauges' values for one window: predictions ``p``, ``c`` and outcomes ``y`` (finished
    within H), ``m`` (realised ``min(r, H)``); NaN where the window cannot say (module
    docstring)."""
    nan = float("nan")
    out = dict.fromkeys(LIVE_QUALITY_METRICS, nan)
    out[LIVE_WINDOW] = float(p.size)
    if p.size < max(1, min_finished):
        return out
    out[LIVE_REMAINING_ERROR] = float(np.mean(np.abs(c - m)))
    if np.unique(y).size < 2:
        return out
    brier = brier_score(p, y)
    out[LIVE_BRIER] = brier
    out[LIVE_CALIBRATION_ERROR] = expected_calibration_error(p, y)
    out[LIVE_AUC] = auc(p, y)
    if holdout_brier is not None and holdout_brier > 0 and math.isfinite(holdout_brier):
        out[PREDICTION_DRIFT] = brier / holdout_brier
    return out


class Window:
    """The last ``size`` scored predictions of one model version: ``(p, c, y, min(r, H))``."""

    def __init__(self, size: int, model: ModelIdentity) -> None:
        self.model = model
        self.rows: deque[tuple[float, float, float, float]] = deque(maxlen=size)

    def add(self, admitted: Admitted, output_tokens: int) -> None:
        y, m = admitted.outcome(output_tokens)
        self.rows.append((admitted.p_finish, admitted.c, y, m))

    def array(self) -> np.ndarray:
        return np.asarray(self.rows, dtype=np.float64).reshape(-1, 4)


class LiveQuality:
    """Predictions at admission, by request key, and the windows of the finished ones; a
    Prometheus collector (register it on a registry: its gauges are computed at scrape)."""

    def __init__(self, window: int | None = None, min_finished: int = MIN_FINISHED) -> None:
        self.size = window_size() if window is None else max(1, int(window))
        self.min_finished = min_finished
        self.pending: OrderedDict[Any, Admitted] = OrderedDict()
        self.windows: OrderedDict[tuple[str, str], Window] = OrderedDict()
        self.lock = threading.Lock()  # a scrape may run in another thread (the service)
        self.failures = 0

    def admit(
        self,
        model: CompletionEstimator | None,
        keys: Sequence[Any],
        prompt_tokens: np.ndarray,
        prompt_key: np.ndarray | None = None,
        age: np.ndarray | None = None,
    ) -> None:
        """Ask ``model`` (the deployed one: :func:`deployed`) for the admitted requests ``keys``
        (``age`` None: just admitted, age 0) and keep its answers until they finish; a model that
        fails is logged, its requests stay without a prediction."""
        if model is None or not len(keys):
            return
        est = deployed(model)
        n = len(keys)
        ages = np.zeros(n, dtype=np.int64) if age is None else np.asarray(age, dtype=np.int64)
        batch = RunningBatch(prompt_tokens=np.asarray(prompt_tokens, dtype=np.int64), age=ages,
                             prompt_key=prompt_key)  # fmt: skip
        try:
            pred = est.predict(batch)
            p = np.asarray(pred.p_finish, dtype=np.float64)
            c = np.asarray(pred.c, dtype=np.float64)
        except Exception:  # the routing decision is made: the log just lacks this prediction
            self.failures += 1
            if self.failures == 1 or self.failures % 1000 == 0:
                log.exception("live quality: the model failed to predict at admission")
            return
        who, h = identity(est), int(est.horizon)
        with self.lock:
            for i, key in enumerate(keys):
                self.pending.pop(key, None)
                self.pending[key] = Admitted(float(p[i]), float(c[i]), h, int(ages[i]), who)
            while len(self.pending) > MAX_PENDING:
                self.pending.popitem(last=False)

    def forget(self, key: Any) -> None:
        """The request ``key`` left without finishing: nothing to score."""
        with self.lock:
            self.pending.pop(key, None)

    def finish(self, key: Any, output_tokens: int) -> tuple[Any, ...]:
        """Request ``key`` finished with ``output_tokens``: scored in its model's window; its
        values of :data:`PREDICTION_COLUMNS` (all None when no estimator predicted for it)."""
        with self.lock:
            admitted = self.pending.pop(key, None)
            if admitted is None:
                return NO_PREDICTION
            m = admitted.model
            label = (m.name, m.version or "")
            win = self.windows.get(label)
            if win is None:
                win = self.windows[label] = Window(self.size, m)
                while len(self.windows) > MAX_VERSIONS:
                    self.windows.popitem(last=False)
            self.windows.move_to_end(label)
            win.add(admitted, output_tokens)
        return admitted.columns()

    def scores(self) -> dict[tuple[str, str], dict[str, float]]:
        """Every kept version's gauges, by ``(model, version)``."""
        with self.lock:
            kept = [(k, w.model.holdout_brier, w.array()) for k, w in self.windows.items()]
        return {k: window_scores(a[:, 0], a[:, 1], a[:, 2], a[:, 3], held, self.min_finished)
                for k, held, a in kept}  # fmt: skip

    def describe(self) -> Iterator[Any]:
        yield from self._families({})

    def collect(self) -> Iterator[Any]:
        yield from self._families(self.scores())

    def _families(self, scores: dict[tuple[str, str], dict[str, float]]) -> Iterator[Any]:
        from prometheus_client.core import GaugeMetricFamily

        for name in (*LIVE_QUALITY_METRICS, LIVE_WINDOW):
            family = GaugeMetricFamily(name, HELP[name], labels=list(LIVE_LABELS))
            for (model, version), values in scores.items():
                family.add_metric([model, version], values[name])
            yield family

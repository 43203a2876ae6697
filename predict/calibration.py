"""Probability calibration maths: expected calibration error, Platt scaling, online recalibration.

- :func:`expected_calibration_error`, :func:`brier_score` and :func:`auc` are the one definitions
  of ECE, Brier and AUC (``training.metrics`` re-exports them; the live quality gauges of
  :mod:`.live_quality` use them too);
- :func:`fit_platt` fits ``p = sigmoid(a * logit(raw) + b)`` by weighted Newton steps, optionally
  pulled toward prior parameters; :func:`platt_scaled` applies it;
- :func:`fit_platt_online` fits it on a held-out slice together with the online recalibrator
  that starts from it (``gbdt`` and ``hazard`` both calibrate this way);
- :class:`OnlineRecalibrator` refits Platt's two parameters on a bounded window of recent
  (score, outcome) pairs, with a fixed sample of the training calibration slice as a prior, so a
  served model follows drift in how often requests finish without retraining the boosters;
- :func:`recalibration_snapshots` draws the snapshots of just-finished requests that the
  learned estimators score, before learning from them, to feed their recalibrators.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from balanceroute.predict.base import CompletedBatch


def expected_calibration_error(
    p: np.ndarray, y: np.ndarray, bins: int = 15, weight: np.ndarray | None = None
) -> float:
    """ECE: (weighted) mean |mean(p) - mean(y)| over equal-width probability bins."""
    if p.size == 0:
        return float("nan")
    w = np.ones_like(p) if weight is None else weight
    b = np.clip((p * bins).astype(np.int64), 0, bins - 1)
    sp = np.bincount(b, weights=w * p, minlength=bins)
    sy = np.bincount(b, weights=w * y, minlength=bins)
    return float(np.abs(sp - sy).sum() / w.sum())


def brier_score(p: np.ndarray, y: np.ndarray) -> float:
    """Brier score: mean squared difference of probabilities ``p`` and outcomes ``y`` in {0, 1}."""
    return float(np.mean((p - y) ** 2)) if p.size else float("nan")


def auc(p: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> float:
    """ROC AUC of scores ``p`` for outcomes ``y``, optionally weighted (NaN when ``y`` has one
    class only)."""
    if np.unique(y).size < 2:
        return float("nan")
    from sklearn.metrics import roc_auc_score  # lazily: a gateway scores only when scraped

    return float(roc_auc_score(y, p, sample_weight=weight))


def logit(p: np.ndarray) -> np.ndarray:
    """log(p / (1 - p)) with p clipped to [1e-6, 1 - 1e-6]."""
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p / (1 - p))


def sigmoid(z: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-z)), without numpy's overflow warning for a very negative ``z`` (an
    unstamped stderr line in a server's log)."""
    return 1.0 / (1.0 + np.exp(-np.clip(z, -500.0, 500.0)))


def fit_platt(
    z: np.ndarray,
    y: np.ndarray,
    w: np.ndarray | None = None,
    *,
    start: tuple[float, float] = (1.0, 0.0),
    ridge: float = 1e-6,
    steps: int = 25,
) -> tuple[float, float]:
    """Weighted logistic regression of ``y`` on ``z`` (slope, intercept) by Newton's method.

    ``ridge`` is a tiny L2 pull toward ``start`` that keeps the 2x2 system solvable when the
    scores are constant or perfectly separating.
    """
    w = np.ones_like(z) if w is None else w
    a0, b0 = float(start[0]), float(start[1])
    theta = np.array([a0, b0])
    for _ in range(steps):
        q = sigmoid(theta[0] * z + theta[1])
        r = w * (q - y)
        s = w * q * (1.0 - q)
        grad = np.array([r @ z, r.sum()]) + ridge * (theta - (a0, b0))
        hess = np.array([[s @ (z * z), s @ z], [s @ z, s.sum()]]) + ridge * np.eye(2)
        step = np.linalg.solve(hess, grad)
        theta -= step
        if np.abs(step).max() < 1e-9:
            break
    return float(theta[0]), float(theta[1])


class OnlineRecalibrator:
    """Platt parameters refitted on the last ``window`` (logit score, outcome) pairs.

    The fit also counts ``prior_z, prior_y`` (a sample of the training calibration slice) with
    total weight ``prior_weight * window``, so a few recent outcomes nudge the static calibration
    and a full window of them mostly decides it. Memory is O(window + prior sample).
    """

    refit_every = 32  # class defaults keep recalibrators pickled before these existed working
    pending = 0
    w: np.ndarray | None = None  # pair weights, once any pair came with one (else all 1)

    def __init__(
        self,
        params: tuple[float, float],
        prior_z: np.ndarray,
        prior_y: np.ndarray,
        prior_w: np.ndarray,
        *,
        window: int = 3000,
        prior_weight: float = 0.5,
        refit_every: int = 32,
    ) -> None:
        self.window = int(window)
        self.refit_every = max(int(refit_every), 1)
        self.pending = 0  # pairs added since the last refit
        self.static = (float(params[0]), float(params[1]))
        self.params = self.static
        self.prior_z = np.asarray(prior_z, dtype=np.float64)
        self.prior_y = np.asarray(prior_y, dtype=np.float64)
        total = float(np.sum(prior_w)) or 1.0
        self.prior_w = np.asarray(prior_w, dtype=np.float64) * (prior_weight * self.window / total)
        self.z = np.zeros(self.window)
        self.y = np.zeros(self.window)
        self.count = 0  # pairs ever added

    def __len__(self) -> int:
        return min(self.count, self.window)

    def add(self, z: np.ndarray, y: np.ndarray, w: np.ndarray | None = None) -> None:
        """Record new (logit score, outcome) pairs, optionally weighted; refit the two
        parameters once at least ``refit_every`` pairs have come in since the last fit (a refit
        costs a few Newton steps over the whole window, far more than recording a pair)."""
        m = int(z.shape[0])
        if m == 0 or self.window == 0:
            return
        keep = slice(max(m - self.window, 0), m)
        k = min(m, self.window)
        slots = (self.count + m - k + np.arange(k)) % self.window
        self.z[slots], self.y[slots] = z[keep], y[keep]
        if w is not None:
            if self.w is None:
                self.w = np.ones(self.window)
            self.w[slots] = w[keep]
        self.count += m
        self.pending += m
        if self.pending < self.refit_every:
            return
        self.pending = 0
        n = len(self)
        zz = np.concatenate([self.prior_z, self.z[:n]])
        yy = np.concatenate([self.prior_y, self.y[:n]])
        ww = np.concatenate([self.prior_w, np.ones(n) if self.w is None else self.w[:n]])
        self.params = fit_platt(zz, yy, ww, start=self.params, steps=4)

    def __call__(self, z: np.ndarray) -> np.ndarray:
        return platt_scaled(z, self.params)


def platt_scaled(
    z: np.ndarray, params: tuple[float, float], online: OnlineRecalibrator | None = None
) -> np.ndarray:
    """``sigmoid(a * z + b)`` of logit scores ``z``: with the ``online`` recalibrator's
    current parameters when one is given, else with the static ``params``."""
    a, b = params if online is None else online.params
    return sigmoid(a * z + b)


def fit_platt_online(
    z: np.ndarray,
    y: np.ndarray,
    w: np.ndarray,
    *,
    seed: int | None,
    prior_sample: int,
    window: int,
    prior_weight: float,
) -> tuple[tuple[float, float], OnlineRecalibrator]:
    """Platt parameters fitted on a held-out slice of (logit score, outcome, weight), and the
    online recalibrator that starts from them, with ``prior_sample`` rows of the slice (drawn
    with ``seed``) as its prior."""
    platt = fit_platt(z, y, w)
    take = np.random.default_rng(seed).permutation(z.size)[:prior_sample]
    online = OnlineRecalibrator(
        platt, z[take], y[take], w[take], window=window, prior_weight=prior_weight
    )
    return platt, online


@dataclass(frozen=True, slots=True)
class RecalSnapshots:
    """Snapshots of finished requests at random ages, with what happened to them."""

    prompt_tokens: np.ndarray
    age: np.ndarray
    prompt_key: np.ndarray | None
    remaining: np.ndarray  # output - age >= 1
    now: float | None  # the latest finish time of the batch (None if unknown)


def recalibration_snapshots(
    done: CompletedBatch, rng: np.random.Generator, window: int, per_request: int
) -> RecalSnapshots:
    """``per_request`` uniform ages of each of the last finished requests that can still count
    in a recalibration window of ``window`` pairs."""
    cap = -(-window // per_request)  # completions that can still count
    sel = np.arange(max(done.size - cap, 0), done.size)
    out = np.asarray(done.output_tokens, dtype=np.int64)[sel]
    rows = np.repeat(np.arange(sel.size), per_request)
    age = np.floor(rng.random(rows.size) * out[rows]).astype(np.int64)
    age = np.minimum(age, out[rows] - 1).clip(min=0)
    keys = None if done.prompt_key is None else np.asarray(done.prompt_key)[sel][rows]
    times = None if done.time_s is None else np.asarray(done.time_s, dtype=np.float64)
    now = None if times is None or np.isnan(times).all() else float(np.nanmax(times))
    prompts = np.asarray(done.prompt_tokens, dtype=np.int64)[sel][rows]
    return RecalSnapshots(prompts, age, keys, out[rows] - age, now)

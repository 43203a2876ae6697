"""``gbdt``: LightGBM on causal features, ``c = p * E[r | r <= H] + (1 - p) * H``.

- a binary classifier for ``1{r <= H}`` and a regressor for ``r`` on finishing rows, both trained
  on :func:`features.causal.training_rows` snapshots with :func:`features.causal.snapshot_features`
  (which include the empirical survival and exactmatch answers at the snapshot's age, stacked);
- at predict time the same features come from :class:`features.causal.OnlineHistory`, which
  ``observe()`` keeps up to date within a bounded window (train/serve parity is tested);
- probabilities are calibrated on the latest ``calib_fraction`` of training requests (held out of
  the boosters): ``isotonic``, ``platt`` or ``none``; all three are fitted, so the choice can be
  switched and compared after training (``calibration_report_`` holds the held-out ECEs); with
  ``refit_full`` the classifier is then retrained on every row, the latest included (the trace
  drifts, so the most recent requests are the most useful ones), keeping those calibrators;
- with ``platt`` and ``recalibrate``, ``observe()`` also scores each finished request at
  ``recal_ages`` random ages of its life *before* learning from it, and refits Platt's two
  parameters on the last ``recal_window`` such (score, outcome) pairs plus a sample of the
  calibration slice (:class:`predict.calibration.OnlineRecalibrator`): causal, bounded, and it
  follows drift in how often requests finish (the Azure trace's share finishing within H falls
  from 0.61 in training to 0.52 later);
- survival curves, and ``c`` with them (``curve``): the calibrated finishing mass ``p`` is spread
  over ``1..H`` like the recent outputs above the request's age (``marginal``, the default), like
  its key's outputs shrunk to the marginal (``key``), or as a truncated geometric whose mean
  matches the regressor's ``E[r | r <= H]`` (``geometric``); ``from_survival`` reproduces ``p``
  and ``c`` in every case. The geometric gives the best ``c`` as a point estimate (Azure
  validation MAE 14.2 against 16.9), but its shape misplaces the near-term departures that BR-H's
  expected projection scores: with ``marginal`` the same classifier took BR-H on Azure from 0.99
  to 0.87 of the no-prediction router's imbalance, and was level on Mooncake and paper-prod;
- prediction walks both boosters flattened to arrays (:class:`Forest`) in one compiled
  single-threaded loop, which gives LightGBM's raw scores exactly but several times faster than
  ``Booster.predict`` on router-sized batches, and is safe inside a server thread. The saved
  model keeps LightGBM's own model text (:meth:`GBDTEstimator.boosters` rebuilds the boosters)
  but no booster objects, so loading it to predict imports neither LightGBM nor scikit-learn
  (about 90 MB less in a serving process).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, ClassVar, Self

import numpy as np
from numba import njit

from balanceroute.features.causal import (
    CausalConfig,
    OnlineHistory,
    trace_snapshot_features,
    training_rows,
)
from balanceroute.features.errors import UserError
from balanceroute.features.schema import to_arrays
from balanceroute.predict.base import (
    DEFAULT_HORIZON,
    CompletedBatch,
    CompletionEstimator,
    Prediction,
    RunningBatch,
)
from balanceroute.predict.calibration import (
    OnlineRecalibrator,
    expected_calibration_error,
    fit_platt,
    logit,
    sigmoid,
)
from balanceroute.predict.empirical import clip01, mixed_count
from balanceroute.predict.keys import derive_keys
from balanceroute.predict.registry import register

if TYPE_CHECKING:
    import lightgbm as lgb
    import pandas as pd

CALIBRATIONS = ("isotonic", "platt", "none")
CURVES = ("geometric", "marginal", "key")
_THETA = np.linspace(-8.0, 8.0, 2001)
PRIOR_SAMPLE = 1024  # calibration-slice rows kept as the online recalibration's prior


def _geometric_means(horizon: int) -> np.ndarray:
    """Mean of the truncated geometric on 1..H with log-ratio theta, for every grid theta."""
    j = np.arange(1, horizon + 1, dtype=np.float64)
    logw = _THETA[:, None] * (j - 1)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    return (w * j).sum(axis=1) / w.sum(axis=1)


def within_horizon_curves(p: np.ndarray, mean: np.ndarray, horizon: int) -> np.ndarray:
    """Survival curves ``(n, H+1)``: ``1 - p * G(h)``, G a truncated geometric with this mean."""
    h = int(horizon)
    n = p.shape[0]
    if h == 0:
        return np.ones((n, 1))
    mu = _geometric_means(h)
    theta = np.interp(np.clip(mean, mu[0], mu[-1]), mu, _THETA)
    logw = theta[:, None] * np.arange(h)[None, :]
    w = np.exp(logw - logw.max(axis=1, keepdims=True))
    g = np.cumsum(w, axis=1) / w.sum(axis=1, keepdims=True)  # G(1..H)
    curves = np.ones((n, h + 1))
    curves[:, 1:] = 1.0 - p[:, None] * g
    return curves


MISSING_TYPES = {"None": 0, "Zero": 1, "NaN": 2}
_ZERO = 1e-35  # LightGBM's kZeroThreshold
MAX_HEAP_DEPTH = 8  # deepest forest scored through the complete-heap layout
MAX_MASK_DEPTH = 6  # deepest forest scored with leaf bitmasks (2**6 leaves in a uint64)
_BLOCK = 32  # rows descending a tree together
_MASK_BLOCK = 512  # rows scored together by the bitmask scorer
_MASK_CHUNK = 65_536  # rows transposed at a time (bounds the copy for big matrices)
_ALL = np.uint64(0xFFFFFFFFFFFFFFFF)
_DEBRUIJN_MAGIC = np.uint64(0x03F79D71B4CB0A89)
# _DEBRUIJN[(b * magic) >> 58] is the index of b's single set bit (b a power of two)
_DEBRUIJN = np.zeros(64, dtype=np.int64)
_DEBRUIJN[[((int(_DEBRUIJN_MAGIC) << k) & (2**64 - 1)) >> 58 for k in range(64)]] = np.arange(64)


def leaf_masks(depth: int) -> tuple[np.ndarray, np.uint64]:
    """Per heap node, the leaves that stay possible when it sends a row right (its left
    subtree's leaves cleared), and the mask of all ``2**depth`` leaves."""
    leaves = 1 << depth
    full = (1 << leaves) - 1
    masks = np.zeros((1 << depth) - 1, dtype=np.uint64)
    for k in range(masks.size):
        level = (k + 1).bit_length() - 1
        span = 1 << (depth - level)
        first = (k - ((1 << level) - 1)) * span
        left = ((1 << (span // 2)) - 1) << first
        masks[k] = np.uint64(full & ~left)
    return masks, np.uint64(full)


@dataclass(frozen=True, slots=True)
class Forest:
    """A LightGBM model flattened to arrays, for a compiled single-thread prediction loop.

    Node ``j`` of the whole forest splits on ``feature[j]`` at ``threshold[j]``; a child ``c >= 0``
    is a node, ``c < 0`` the leaf ``~c``; ``root[t]`` is tree ``t``'s first node (or ``~leaf``
    when the tree is a single leaf). Decisions follow LightGBM's ``NumericalDecision`` exactly
    (missing values by ``missing_type`` and ``default_left``), so raw scores match
    ``Booster.predict(raw_score=True)``.

    When every tree is at most ``MAX_HEAP_DEPTH`` deep (``max_depth`` bounds it) and no node
    treats zero as missing, the trees are also laid out as complete binary heaps of the forest's
    depth ``D`` (node ``k``'s children ``2k+1``, ``2k+2``; shallower leaves pushed down through
    splits that always go left): every row then takes exactly ``D`` branch-free steps per tree.
    Up to ``MAX_MASK_DEPTH`` the rows are scored QuickScorer-style instead: every node of a tree
    is tested on a whole block of rows at once (one contiguous feature column, vectorised), a
    node that sends a row right clears its left subtree's leaves from that row's bitmask, and
    the exit leaf is the lowest leaf left. Leaf values are added in the same tree order on
    every path, so all three give LightGBM's raw scores exactly.
    """

    root: np.ndarray  # int64 (trees,)
    feature: np.ndarray  # int64 (nodes,)
    threshold: np.ndarray  # float64 (nodes,)
    child: np.ndarray  # int64 (2 * nodes,): left, right of each node
    nan_right: np.ndarray  # bool (nodes,): where a NaN value goes
    zero_right: np.ndarray  # int8 (nodes,): where a zero goes under missing type Zero, else -1
    leaf_value: np.ndarray  # float64 (leaves,)
    depth: int = 0  # D of the heap layout (0 = not available)
    heap_feature: np.ndarray | None = None  # int64 (trees, 2**D - 1)
    heap_threshold: np.ndarray | None = None  # float64 (trees, 2**D - 1)
    heap_nan_right: np.ndarray | None = None  # bool (trees, 2**D - 1)
    heap_leaf: np.ndarray | None = None  # float64 (trees, 2**D)
    leaf_mask: np.ndarray | None = None  # uint64 (2**D - 1,): see :func:`leaf_masks`
    all_leaves: int = 0  # the mask of every leaf

    @classmethod
    def from_booster(cls, booster: lgb.Booster) -> Forest:
        model = booster.dump_model()
        if model["num_tree_per_iteration"] != 1 or model["average_output"]:
            raise ValueError("only single-output boosted models can be flattened")
        nodes: list[tuple[int, float, bool, int]] = []
        kids: list[list[int]] = []
        leaves: list[float] = []
        roots: list[int] = []

        def walk(tree: dict[str, Any]) -> int:
            if "leaf_value" in tree:
                leaves.append(float(tree["leaf_value"]))
                return ~(len(leaves) - 1)
            if tree["decision_type"] != "<=":
                raise ValueError("categorical splits are not supported")
            j = len(nodes)
            nodes.append(
                (
                    int(tree["split_feature"]),
                    float(tree["threshold"]),
                    bool(tree["default_left"]),
                    MISSING_TYPES[tree["missing_type"]],
                )
            )
            kids.append([0, 0])
            kids[j][0] = walk(tree["left_child"])
            kids[j][1] = walk(tree["right_child"])
            return j

        for info in model["tree_info"]:
            roots.append(walk(info["tree_structure"]))
        feature, threshold, default_left, missing = (
            np.asarray(col) for col in (zip(*nodes, strict=True) if nodes else ((),) * 4)
        )
        threshold = threshold.astype(np.float64)
        default_left = default_left.astype(np.bool_)
        missing = missing.astype(np.int8)
        # NumericalDecision: NaN is 0.0 unless the type is NaN; NaN (type NaN) and zero (type
        # Zero) take the default side; everything else compares ``v <= threshold``.
        nan_right = np.where(missing == 0, 0.0 > threshold, ~default_left)
        zero_right = np.where(missing == 1, (~default_left).astype(np.int8), -1).astype(np.int8)
        flat = cls(
            root=np.asarray(roots, dtype=np.int64),
            feature=feature.astype(np.int64),
            threshold=threshold,
            child=np.asarray(kids, dtype=np.int64).reshape(-1),
            nan_right=nan_right.astype(np.bool_),
            zero_right=zero_right,
            leaf_value=np.asarray(leaves, dtype=np.float64),
        )
        return flat._with_heaps()

    def _with_heaps(self) -> Forest:
        """This forest plus the complete-heap layout, when it is shallow enough."""

        def depth(node: int) -> int:
            if node < 0:
                return 0
            return 1 + max(depth(int(self.child[2 * node])), depth(int(self.child[2 * node + 1])))

        d = max((depth(int(r)) for r in self.root), default=0)
        if d > MAX_HEAP_DEPTH or (self.zero_right >= 0).any():
            return self
        inner = (1 << d) - 1
        trees = self.root.size
        feat = np.zeros((trees, inner), dtype=np.int64)
        thr = np.full((trees, inner), np.inf)  # unused slots always go left (NaN too)
        nan_right = np.zeros((trees, inner), dtype=np.bool_)
        leaf = np.zeros((trees, inner + 1))
        for t, root in enumerate(self.root):
            stack = [(int(root), 0, 0)]  # (node or ~leaf, heap slot, level)
            while stack:
                node, k, level = stack.pop()
                if level == d:
                    leaf[t, k - inner] = self.leaf_value[~node]
                elif node < 0:
                    stack.append((node, 2 * k + 1, level + 1))
                else:
                    feat[t, k] = self.feature[node]
                    thr[t, k] = self.threshold[node]
                    nan_right[t, k] = self.nan_right[node]
                    stack.append((int(self.child[2 * node]), 2 * k + 1, level + 1))
                    stack.append((int(self.child[2 * node + 1]), 2 * k + 2, level + 1))
        masks, full = leaf_masks(d) if d <= MAX_MASK_DEPTH else (None, 0)
        return replace(
            self,
            depth=d,
            heap_feature=feat,
            heap_threshold=thr,
            heap_nan_right=nan_right,
            heap_leaf=leaf,
            leaf_mask=masks,
            all_leaves=int(full),
        )

    @property
    def size(self) -> int:
        return int(self.root.size)

    def raw(self, x: np.ndarray) -> np.ndarray:
        """Raw scores (sum of leaf values) of the rows of ``x``, single-threaded.

        A column-major ``x`` (as :meth:`OnlineHistory.features` builds it) is scored without
        a copy by the bitmask scorer.
        """
        if getattr(self, "leaf_mask", None) is not None:
            x = np.asarray(x, dtype=np.float64)
            out = np.empty(x.shape[0])
            for lo in range(0, x.shape[0], _MASK_CHUNK):
                xt = np.ascontiguousarray(x[lo : lo + _MASK_CHUNK].T)
                out[lo : lo + xt.shape[1]] = _mask_raw(
                    xt,
                    self.heap_feature,
                    self.heap_threshold,
                    self.heap_nan_right,
                    self.heap_leaf,
                    self.leaf_mask,
                    np.uint64(self.all_leaves),
                    _DEBRUIJN,
                )
            return out
        x = np.ascontiguousarray(x, dtype=np.float64)
        if self.heap_leaf is not None:
            return _heap_raw(
                x,
                self.depth,
                self.heap_feature,
                self.heap_threshold,
                self.heap_nan_right,
                self.heap_leaf,
            )
        return _forest_raw(
            x,
            self.root,
            self.feature,
            self.threshold,
            self.child,
            self.nan_right,
            self.zero_right,
            self.leaf_value,
        )


@njit(cache=True, nogil=True)
def _shaped_curves(surv, ages, horizon, key_surv, bw, s_a, mass, ok, p):
    """``1 - p * F(h)`` with ``F(h) = (S(a) - S(a+h)) / mass`` from the marginal's counts (plus
    the key's, ``key_surv + bw * S_m``, when given), ``h / H`` where there is no mass."""
    n = ages.shape[0]
    out = np.ones((n, horizon + 1))
    for i in range(n):
        for h in range(1, horizon + 1):
            if ok[i]:
                s = mixed_count(surv, key_surv, i, ages[i] + h, h, bw, 1.0)
                f = (s_a[i] - s) / mass[i]
            else:
                f = h / horizon
            out[i, h] = 1.0 - p[i] * clip01(f)
    return out


@njit(cache=True, nogil=True)
def _mask_raw(xt, feature, threshold, nan_right, leaf, masks, full, debruijn):
    """Sum of leaf values per column of ``xt`` ``(features, n)`` over complete-heap trees,
    by leaf bitmasks (see :class:`Forest`); branch-free over rows, so the compiler vectorises."""
    n = xt.shape[1]
    trees, inner = feature.shape
    out = np.zeros(n)
    m = np.empty(_MASK_BLOCK, np.uint64)
    zero = np.uint64(0)
    for i0 in range(0, n, _MASK_BLOCK):
        w = min(_MASK_BLOCK, n - i0)
        mv = m[:w]
        for t in range(trees):
            mv[:] = full
            for j in range(inner):
                th = threshold[t, j]
                if th == np.inf:  # a padding split: every row goes left
                    continue
                col = xt[feature[t, j], i0 : i0 + w]
                keep = masks[j]
                if nan_right[t, j]:  # NaN goes right: not (v <= th) is true for NaN
                    for r in range(w):
                        right = np.uint64(not (col[r] <= th))
                        mv[r] &= keep | ((zero - right) ^ _ALL)
                else:
                    for r in range(w):
                        right = np.uint64(col[r] > th)
                        mv[r] &= keep | ((zero - right) ^ _ALL)
            values = leaf[t]
            for r in range(w):
                b = mv[r]
                low = b & (~b + np.uint64(1))
                out[i0 + r] += values[debruijn[(low * _DEBRUIJN_MAGIC) >> np.uint64(58)]]
    return out


@njit(cache=True, nogil=True)
def _heap_raw(x, depth, feature, threshold, nan_right, leaf):
    """Sum of leaf values per row over complete-heap trees: ``depth`` branch-free steps.

    Rows go through each tree in blocks of ``_BLOCK`` so that their independent descents overlap
    (one descent alone is a chain of dependent loads); leaves still add up in tree order.
    """
    n = x.shape[0]
    inner = feature.shape[1]
    out = np.zeros(n)
    k = np.zeros(_BLOCK, np.int64)
    for i0 in range(0, n, _BLOCK):
        m = min(_BLOCK, n - i0)
        for t in range(feature.shape[0]):
            k[:m] = 0
            for _ in range(depth):
                for r in range(m):
                    kr = k[r]
                    v = x[i0 + r, feature[t, kr]]
                    go = (v > threshold[t, kr]) | ((v != v) & nan_right[t, kr])
                    k[r] = 2 * kr + 1 + go
            for r in range(m):
                out[i0 + r] += leaf[t, k[r] - inner]
    return out


@njit(cache=True, nogil=True)
def _forest_raw(x, root, feature, threshold, child, nan_right, zero_right, leaf_value):
    """Sum of leaf values per row; a node's child is ``child[2 * node + go_right]``."""
    n = x.shape[0]
    out = np.zeros(n)
    for i in range(n):
        acc = 0.0
        for t in range(root.shape[0]):
            node = root[t]
            while node >= 0:
                v = x[i, feature[node]]
                go = v > threshold[node]
                if v != v:
                    go = nan_right[node]
                elif zero_right[node] >= 0 and -_ZERO <= v <= _ZERO:
                    go = zero_right[node] == 1
                node = child[2 * node + go]
            acc += leaf_value[~node]
        out[i] = acc
    return out


@register
class GBDTEstimator(CompletionEstimator):
    """Calibrated LightGBM classifier + regressor on causal history features."""

    name = "gbdt"
    provides_survival = True
    projection = "expected"

    def __init__(
        self,
        *,
        horizon: int = DEFAULT_HORIZON,
        n_estimators: int = 150,
        learning_rate: float = 0.1,
        num_leaves: int = 8,
        min_data_in_leaf: int = 500,
        lambda_l2: float = 10.0,
        feature_fraction: float = 0.7,
        reg_estimators: int = 40,
        reg_learning_rate: float = 0.12,
        reg_num_leaves: int = 15,
        max_depth: int = 3,
        reg_max_depth: int = 4,
        step: int = 8,
        per_request: int = 32,
        max_rows: int = 1_000_000,
        calibration: str = "platt",
        calib_fraction: float = 0.1,
        recalibrate: bool = True,
        refit_full: bool = True,
        recal_window: int = 2000,
        recal_ages: int = 2,
        recal_prior: float = 0.25,
        assumed_tpot_s: float = 0.06,
        window: int = 131_072,
        cond_windows: tuple[int, ...] = (1024,),
        num_threads: int = 0,
        curve: str = "marginal",
        seed: int = 0,
    ) -> None:
        super().__init__(horizon=horizon)
        if curve not in CURVES:
            raise UserError(f"unknown curve '{curve}'; known: {', '.join(CURVES)}")
        self.curve = curve
        if calibration not in CALIBRATIONS:
            raise UserError(
                f"unknown calibration '{calibration}'; known: {', '.join(CALIBRATIONS)}"
            )
        self.n_estimators = int(n_estimators)
        self.learning_rate = float(learning_rate)
        self.num_leaves = int(num_leaves)
        self.min_data_in_leaf = int(min_data_in_leaf)
        self.lambda_l2 = float(lambda_l2)
        self.feature_fraction = float(feature_fraction)
        self.reg_estimators = int(reg_estimators)
        self.reg_learning_rate = float(reg_learning_rate)
        self.reg_num_leaves = int(reg_num_leaves)
        self.max_depth = int(max_depth)
        self.reg_max_depth = int(reg_max_depth)
        self.step = int(step)
        self.per_request = int(per_request)
        self.max_rows = int(max_rows)
        self.calibration = calibration
        self.calib_fraction = float(calib_fraction)
        self.recalibrate = bool(recalibrate)
        self.refit_full = bool(refit_full)
        self.recal_window = int(recal_window)
        self.recal_ages = int(recal_ages)
        self.recal_prior = float(recal_prior)
        self.assumed_tpot_s = float(assumed_tpot_s)
        self.window = int(window)
        self.cond_windows = tuple(int(w) for w in cond_windows)
        self.num_threads = int(num_threads)
        self.seed = int(seed)

    PARAMS: ClassVar[tuple[str, ...]] = (
        "horizon",
        "n_estimators",
        "learning_rate",
        "num_leaves",
        "max_depth",
        "min_data_in_leaf",
        "lambda_l2",
        "feature_fraction",
        "reg_estimators",
        "reg_learning_rate",
        "reg_num_leaves",
        "reg_max_depth",
        "step",
        "per_request",
        "max_rows",
        "calibration",
        "calib_fraction",
        "refit_full",
        "recalibrate",
        "recal_window",
        "recal_ages",
        "recal_prior",
        "assumed_tpot_s",
        "window",
        "cond_windows",
        "num_threads",
        "curve",
        "seed",
    )

    def params(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.PARAMS}

    def check_fitted(self) -> None:
        super().check_fitted()
        if not hasattr(self, "forests_"):
            raise UserError(
                "this gbdt model was saved by an older version of balanceroute (no compiled "
                "forest, no stacked empirical features): retrain it with `balanceroute train`"
            )

    def _booster_params(self, objective: str) -> dict[str, Any]:
        classifier = objective == "binary"
        return {
            "objective": objective,
            "learning_rate": self.learning_rate if classifier else self.reg_learning_rate,
            "num_leaves": self.num_leaves if classifier else self.reg_num_leaves,
            "max_depth": self.max_depth if classifier else self.reg_max_depth,
            "min_data_in_leaf": self.min_data_in_leaf,
            "lambda_l2": self.lambda_l2 if classifier else 0.0,
            "feature_fraction": self.feature_fraction if classifier else 0.9,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "verbose": -1,
        }

    def fit(self, history: pd.DataFrame) -> Self:
        import lightgbm as lgb

        if len(history) < 10:
            raise UserError(f"gbdt needs at least 10 requests to train, got {len(history)}")
        cfg = CausalConfig(
            assumed_tpot_s=self.assumed_tpot_s,
            window=self.window,
            horizon=self.horizon,
            cond_windows=tuple(min(w, self.window) for w in self.cond_windows),
        )
        arrays = to_arrays(history)
        req, age, weight = training_rows(
            arrays.output_tokens,
            step=self.step,
            per_request=self.per_request,
            max_rows=self.max_rows,
            seed=self.seed,
        )
        x = trace_snapshot_features(arrays, req, age, cfg)
        r = arrays.output_tokens[req] - age
        y = (r <= self.horizon).astype(np.float64)
        calib = req >= int(arrays.size * (1.0 - self.calib_fraction))
        if calib.all() or not calib.any():
            raise UserError("gbdt: too few requests to hold some out for calibration")
        fit = ~calib
        names = list(cfg.feature_names)
        classifier = lgb.train(
            self._booster_params("binary"),
            lgb.Dataset(x[fit], y[fit], weight=weight[fit], feature_name=names),
            num_boost_round=self.n_estimators,
        )
        fin = fit & (y > 0)
        regressor = lgb.train(
            self._booster_params("regression"),
            lgb.Dataset(x[fin], r[fin].astype(np.float64), weight=weight[fin], feature_name=names),
            num_boost_round=max(self.reg_estimators, 1),
        )
        self.forests_ = (Forest.from_booster(classifier), Forest.from_booster(regressor))
        self._fit_calibrators(x[calib], y[calib], weight[calib])
        if self.refit_full:
            classifier = lgb.train(
                self._booster_params("binary"),
                lgb.Dataset(x, y, weight=weight, feature_name=names),
                num_boost_round=self.n_estimators,
            )
            self.forests_ = (Forest.from_booster(classifier), self.forests_[1])
        self.booster_text_ = (classifier.model_to_string(), regressor.model_to_string())
        self.feature_names_ = names
        self.n_rows_ = int(x.shape[0])
        self.config_ = cfg
        self.history_ = OnlineHistory(cfg)
        finish = cfg.finish_times(arrays)
        o = np.argsort(finish, kind="stable")
        self.history_.observe(
            arrays.prompt_tokens[o], arrays.output_tokens[o], arrays.prompt_key[o], finish[o]
        )
        self.rng_ = np.random.default_rng(self.seed)
        self.fitted_ = True
        return self

    def boosters(self) -> tuple[lgb.Booster, lgb.Booster]:
        """The fitted LightGBM classifier and regressor, rebuilt from their saved model text."""
        import lightgbm as lgb

        self.check_fitted()
        clf, reg = (lgb.Booster(model_str=text) for text in self.booster_text_)
        return clf, reg

    def _fit_calibrators(self, x: np.ndarray, y: np.ndarray, w: np.ndarray) -> None:
        from sklearn.isotonic import IsotonicRegression

        raw = sigmoid(self.forests_[0].raw(x))
        iso = IsotonicRegression(y_min=0.0, y_max=1.0, out_of_bounds="clip")
        iso.fit(raw, y, sample_weight=w)
        z = logit(raw)
        platt = fit_platt(z, y, w)
        self.calibrators_ = {
            "isotonic": (iso.X_thresholds_.copy(), iso.y_thresholds_.copy()),
            "platt": platt,
        }
        take = np.random.default_rng(self.seed).permutation(z.size)[:PRIOR_SAMPLE]
        self.recalibrator_ = OnlineRecalibrator(
            platt,
            z[take],
            y[take],
            w[take],
            window=self.recal_window,
            prior_weight=self.recal_prior,
        )
        self.calibration_report_ = {
            f"calib_ece_{name}": expected_calibration_error(self._calibrate(raw, name), y, weight=w)
            for name in CALIBRATIONS
        }

    def _calibrate(self, raw: np.ndarray, how: str, *, online: bool = False) -> np.ndarray:
        """Calibrated probabilities from the classifier's probabilities ``raw``."""
        if how == "isotonic":
            xs, ys = self.calibrators_["isotonic"]
            return np.interp(raw, xs, ys)
        if how == "platt":
            if online and self.recalibrate:
                return self.recalibrator_(logit(raw))
            a, b = self.calibrators_["platt"]
            return sigmoid(a * logit(raw) + b)
        return raw

    def observe(self, completions: CompletedBatch) -> None:
        """Learn from finished requests (in finish order): recalibration pairs, then history.

        Each finished request is first scored at ``recal_ages`` random ages with the history as it
        stood before it finished (it is not in there yet), and the (score, finished-within-H)
        pairs go to the online recalibrator; only then does the history take it in.
        """
        self.check_fitted()
        if self.recalibrate and self.recal_ages > 0 and completions.size:
            self._recalibrate(completions)
        self.history_.observe(
            completions.prompt_tokens,
            completions.output_tokens,
            completions.prompt_key,
            completions.time_s,
        )

    def _recalibrate(self, done: CompletedBatch) -> None:
        cap = -(-self.recal_window // self.recal_ages)  # completions that can still count
        sel = np.arange(max(done.size - cap, 0), done.size)
        out = np.asarray(done.output_tokens, dtype=np.int64)[sel]
        rows = np.repeat(np.arange(sel.size), self.recal_ages)
        age = np.floor(self.rng_.random(rows.size) * out[rows]).astype(np.int64)
        age = np.minimum(age, out[rows] - 1).clip(min=0)
        keys = None if done.prompt_key is None else np.asarray(done.prompt_key)[sel][rows]
        times = None if done.time_s is None else np.asarray(done.time_s, dtype=np.float64)
        now = None if times is None or np.isnan(times).all() else float(np.nanmax(times))
        x = self.history_.features(
            now, np.asarray(done.prompt_tokens, dtype=np.int64)[sel][rows], age, keys
        )
        z = logit(sigmoid(self.forests_[0].raw(x)))
        y = (out[rows] - age <= self.horizon).astype(np.float64)
        self.recalibrator_.add(z, y)

    def features(self, batch: RunningBatch) -> np.ndarray:
        """The causal feature matrix the boosters see for a batch."""
        self.check_fitted()
        return self.history_.features(
            batch.time_s,
            np.asarray(batch.prompt_tokens),
            np.asarray(batch.age),
            batch.prompt_key,
        )

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        h = self.horizon
        if batch.size == 0:
            empty = np.zeros(0)
            return Prediction(empty, empty, np.zeros((0, h + 1)) if survival else None)
        x = self.features(batch)
        classifier, regressor = self.forests_
        raw = sigmoid(classifier.raw(x))
        p = np.clip(self._calibrate(raw, self.calibration, online=True), 0.0, 1.0)
        if getattr(self, "curve", "geometric") != "geometric":  # models saved before: geometric
            return self._empirical_shape(batch, p, survival)
        mean = np.clip(regressor.raw(x), 1.0, h)
        if survival:
            curves = within_horizon_curves(p, mean, h)
            c = curves[:, :h].sum(axis=1)
            return Prediction(p_finish=1.0 - curves[:, h], c=c, survival=curves)
        return Prediction(p_finish=p, c=np.clip(p * mean + (1.0 - p) * h, min(1.0, h), h))

    def _empirical_shape(self, batch: RunningBatch, p: np.ndarray, survival: bool) -> Prediction:
        """``P(r > h) = 1 - p * F(h)``: the calibrated ``p`` spread over the horizon like the
        window's own outputs above the age (``marginal``) or the key's, shrunk to the marginal
        (``key``); where those have no mass within the horizon, like a uniform hazard."""
        h = self.horizon
        hist = self.history_
        win = hist.cfg.window
        age = np.asarray(batch.age, dtype=np.int64)
        mc = hist.marginal[win]
        s_a, s_b = mc.surv(age), mc.surv(age + h)
        inside = mc.csurv(age + h) - mc.csurv(age)  # sum_{j<H} S(a + j)
        key_surv, bw = np.zeros((0, 0)), 1.0  # marginal: S_m alone
        if self.curve == "key":
            has_keys = batch.prompt_key is not None and bool(np.any(batch.prompt_key))
            src = "hash" if has_keys else "exact-length"
            keys = derive_keys(src, np.asarray(batch.prompt_tokens), batch.prompt_key)
            kc = hist.keyed[(src, win)]
            _, k_a, k_b, k_in = kc.query(keys, age, h)
            bw = hist.cfg.em_prior / max(mc.n, 1)
            s_a, s_b, inside = k_a + bw * s_a, k_b + bw * s_b, k_in + bw * inside
            if survival:
                key_surv = kc.surv_matrix(keys, age, h)
        mass = s_a - s_b
        ok = mass > 0
        safe = np.where(ok, mass, 1.0)
        # sum_{j<H} F(j) with F(j) = (S(a) - S(a+j)) / mass; uniform hazard: (H - 1) / 2
        f_sum = np.where(ok, (h * s_a - inside) / safe, (h - 1) / 2.0)
        c = np.clip(h - p * f_sum, min(1.0, h), h)
        if not survival:
            return Prediction(p_finish=p, c=c)
        surv_table, _ = mc.curves()
        curves = _shaped_curves(
            surv_table,
            age,
            h,
            key_surv,
            float(bw),
            np.ascontiguousarray(s_a, dtype=np.float64),
            np.ascontiguousarray(safe, dtype=np.float64),
            np.ascontiguousarray(ok),
            np.ascontiguousarray(p, dtype=np.float64),
        )
        return Prediction(p_finish=1.0 - curves[:, h], c=curves[:, :h].sum(axis=1), survival=curves)

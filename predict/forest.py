"""A LightGBM model flattened to arrays and scored by compiled single-thread loops.

:class:`Forest` gives ``Booster.predict(raw_score=True)`` exactly, several times faster on
router-sized batches, and is safe inside a server thread (no OpenMP pool). It is built from a
booster's ``dump_model()`` and holds only numpy arrays, so a process that scores a saved model
never imports LightGBM. ``tests/predict/test_forest.py`` holds every scorer to LightGBM.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

if TYPE_CHECKING:
    import lightgbm as lgb

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

    def raw_grouped(self, x_shared: np.ndarray, x_rows: np.ndarray) -> np.ndarray:
        """Raw scores of ``n * m`` rows that come in groups of ``m`` sharing their first
        ``F`` features: row ``i * m + j`` is ``x_shared[i]`` followed by ``x_rows[i * m + j]``.

        Equal to :meth:`raw` on the rows written out, bit for bit, but a split on a shared
        feature is tested once per group instead of once per row (the hazard model's
        person-period rows share every feature but their bin's). Needs the bitmask layout.
        """
        if getattr(self, "leaf_mask", None) is None:
            n, m = x_shared.shape[0], x_rows.shape[0] // max(x_shared.shape[0], 1)
            full = np.concatenate([np.repeat(x_shared, m, axis=0), x_rows], axis=1)
            return self.raw(full)
        n = x_shared.shape[0]
        m = x_rows.shape[0] // max(n, 1)
        out = np.empty(n * m)
        step = max(_MASK_BLOCK // max(m, 1), 1)
        for lo in range(0, n, step * 64):
            hi = min(lo + step * 64, n)
            xs = np.ascontiguousarray(np.asarray(x_shared[lo:hi], dtype=np.float64).T)
            xr = np.ascontiguousarray(np.asarray(x_rows[lo * m : hi * m], dtype=np.float64).T)
            out[lo * m : hi * m] = _grouped_mask_raw(xs, xr, m, step, *self._mask_tables())
        return out

    def _mask_tables(self) -> tuple:
        """The trees as the bitmask scorers take them: heap-ordered nodes and leaves, the
        leaves' masks, the all-leaves mask and the de Bruijn table."""
        return (
            self.heap_feature,
            self.heap_threshold,
            self.heap_nan_right,
            self.heap_leaf,
            self.leaf_mask,
            np.uint64(self.all_leaves),
            _DEBRUIJN,
        )

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
                out[lo : lo + xt.shape[1]] = _mask_raw(xt, *self._mask_tables())
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


@njit(cache=True, nogil=True, inline="always")
def _clear_right(masks, col, th, nan_right, keep):
    """``masks &= keep`` where the value goes right (``not v <= th`` if NaN goes right)."""
    zero = np.uint64(0)
    if nan_right:
        for r in range(masks.shape[0]):
            right = np.uint64(not (col[r] <= th))
            masks[r] &= keep | ((zero - right) ^ _ALL)
    else:
        for r in range(masks.shape[0]):
            right = np.uint64(col[r] > th)
            masks[r] &= keep | ((zero - right) ^ _ALL)


@njit(cache=True, nogil=True)
def _grouped_mask_raw(xs, xr, m, step, feature, threshold, nan_right, leaf, masks, full, debruijn):
    """:func:`_mask_raw` over rows in groups of ``m`` that share the features ``xs``
    ``(F, n)``; ``xr`` ``(F', n * m)`` holds each row's own features (``F + k`` is ``xr[k]``).
    Shared splits narrow a group's mask once, then each row's own splits narrow its copy."""
    n_shared = xs.shape[0]
    n = xs.shape[1]
    trees, inner = feature.shape
    out = np.zeros(n * m)
    ms = np.empty(step, np.uint64)
    mr = np.empty(step * m, np.uint64)
    for g0 in range(0, n, step):
        gw = min(step, n - g0)
        rw = gw * m
        mg = ms[:gw]
        mv = mr[:rw]
        for t in range(trees):
            mg[:] = full
            own = False
            for j in range(inner):
                th = threshold[t, j]
                if th == np.inf:
                    continue
                f = feature[t, j]
                if f < n_shared:
                    _clear_right(mg, xs[f, g0 : g0 + gw], th, nan_right[t, j], masks[j])
                else:
                    own = True
            for s in range(gw):
                mv[s * m : (s + 1) * m] = mg[s]
            if own:
                for j in range(inner):
                    th = threshold[t, j]
                    f = feature[t, j]
                    if th == np.inf or f < n_shared:
                        continue
                    col = xr[f - n_shared, g0 * m : g0 * m + rw]
                    _clear_right(mv, col, th, nan_right[t, j], masks[j])
            values = leaf[t]
            for r in range(rw):
                b = mv[r]
                low = b & (~b + np.uint64(1))
                out[g0 * m + r] += values[debruijn[(low * _DEBRUIJN_MAGIC) >> np.uint64(58)]]
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

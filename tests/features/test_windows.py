"""Sliding windows and survival counts (``features.windows``), the as-of sweep (``features.asof``)
and the compiled kernels of ``features``, each held to its numpy definition."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.signal import lfilter

from balanceroute.features.asof import asof_key_survival, asof_key_terms
from balanceroute.features.blend import blend_terms, conditional_answers, conditional_curves
from balanceroute.features.causal import CausalConfig, OnlineHistory
from balanceroute.features.causal.columns import (
    cond_columns,
    ewma_kernel,
    key_stat_columns,
)
from balanceroute.features.causal.config import COND_STATS, EM_STATS, KEY_STATS
from balanceroute.features.keys import derive_keys
from balanceroute.features.windows import (
    KeyedCounts,
    MarginalCounts,
    SlidingWindow,
    ring_append,
    ring_latest,
    ring_leaving,
)


def _replayed_counts(keys, out, upto, window):
    """KeyedCounts and SlidingWindow fed the first ``upto`` completions in uneven batches."""
    keyed, ring = KeyedCounts(), SlidingWindow(window)
    for lo in range(0, upto, 37):
        hi = min(lo + 37, upto)
        ev_k, ev_o, keep = ring.push(keys[lo:hi], out[lo:hi])
        keyed.remove(ev_k, ev_o)
        keyed.add(keys[lo:hi][keep], out[lo:hi][keep])
    return keyed


def test_asof_key_terms_match_the_online_counts_at_every_point():
    """The offline as-of sweep answers each query as KeyedCounts would at that point in time."""
    rng = np.random.default_rng(0)
    n, window, horizon = 900, 250, 16
    keys = rng.integers(0, 30, n).astype(np.uint64)  # key 0 = none, mixed in
    out = rng.integers(1, 120, n)
    q = 300
    done = rng.integers(0, n + 1, q)
    q_keys = rng.integers(0, 33, q).astype(np.uint64)  # some never seen
    ages = rng.integers(0, 130, q)
    offline = asof_key_terms(keys, out, q_keys, done, ages, horizon, window)
    for j in range(0, q, 5):
        keyed = _replayed_counts(keys, out, int(done[j]), window)
        online = keyed.query(q_keys[[j]], ages[[j]], horizon)
        for got, want in zip(offline, online, strict=True):
            assert got[j] == want[0]


def test_asof_key_survival_matches_the_online_counts_at_every_point():
    """The as-of survival counts at offsets are what ``KeyedCounts.surv_matrix`` gives at those
    columns then, and the key counts what ``query`` counts."""
    rng = np.random.default_rng(4)
    n, window = 700, 200
    keys = rng.integers(0, 25, n).astype(np.uint64)
    out = rng.integers(1, 90, n)
    q = 200
    done = rng.integers(0, n + 1, q)
    q_keys = rng.integers(0, 28, q).astype(np.uint64)
    ages = rng.integers(0, 100, q)
    offsets = np.array([0, 1, 2, 5, 9, 20])
    n_off, s_off = asof_key_survival(keys, out, q_keys, done, ages, offsets, window)
    for j in range(0, q, 4):
        keyed = _replayed_counts(keys, out, int(done[j]), window)
        assert n_off[j] == keyed.query(q_keys[[j]], ages[[j]], 1)[0][0]
        matrix = keyed.surv_matrix(q_keys[[j]], ages[[j]], int(offsets[-1]))
        np.testing.assert_array_equal(s_off[j], matrix[0, offsets])


def test_ring_positions_follow_the_logical_order():
    """Item p lives at slot p % capacity; batches larger than the ring keep their last items."""
    cap, total = 7, 0
    store = np.full(cap, -1)
    seen: list[int] = []
    for m in (3, 5, 9, 1, 0, 12, 2):
        batch = np.arange(total, total + m)
        gone = ring_leaving(total, m, 4, cap)
        window = seen[-4:]
        leaving = [p for p in window if p not in (seen + batch.tolist())[-4:]]
        assert sorted(store[gone].tolist()) == sorted(p for p in leaving if p >= total - cap)
        keep, slots = ring_append(total, m, cap)
        store[slots] = batch[keep]
        seen += batch.tolist()
        total += m
        assert store[ring_latest(total, min(total, cap), cap)].tolist() == seen[-cap:]


def _random_counts(rng, n=400, keys=12, max_out=150):
    k = rng.integers(0, keys, n).astype(np.uint64)
    o = rng.integers(1, max_out, n)
    keyed, marginal = KeyedCounts(), MarginalCounts()
    keyed.add(k, o)
    marginal.add(o, 1)
    return keyed, marginal


def test_key_survival_matrix_kernel_equals_its_query():
    """``surv_matrix[:, h]`` is ``S_key(a + h)``, what ``query`` answers at age ``a + h``."""
    rng = np.random.default_rng(1)
    keyed, _ = _random_counts(rng)
    q = rng.integers(0, 14, 200).astype(np.uint64)
    ages = rng.integers(0, 160, 200)
    h = 24
    mat = keyed.surv_matrix(q, ages, h)
    for j in range(h + 1):
        np.testing.assert_array_equal(mat[:, j], keyed.query(q, ages + j, h)[1])


def test_conditional_curves_kernel_equals_the_blend():
    """The compiled curves are ``clip01(blend(S(a+h)) / den)`` where alive, 1 elsewhere."""
    rng = np.random.default_rng(2)
    keyed, marginal = _random_counts(rng)
    q = rng.integers(0, 14, 150).astype(np.uint64)
    ages = rng.integers(0, 200, 150)
    h = 16
    bw = np.full(ages.size, 2.0 / marginal.n)
    aw = (rng.random(ages.size) > 0.3).astype(float)
    key = keyed.query(q, ages, h)[1:]
    marg = (
        marginal.surv(ages),
        marginal.surv(ages + h),
        marginal.csurv(ages + h) - marginal.csurv(ages),
    )
    den, num_b, num_c = blend_terms(marg, key, bw, aw)
    alive, safe, _, _ = conditional_answers(den, num_b, num_c, unknown_p=0.0, unknown_c=h)
    key_surv = keyed.surv_matrix(q, ages, h)
    got = conditional_curves(marginal.curves()[0], ages, h, bw, aw, key_surv, alive, safe)
    want = np.ones((ages.size, h + 1))
    for j in range(1, h + 1):
        num = bw * marginal.surv(ages + j) + aw * key_surv[:, j]
        want[:, j] = np.where(alive, np.clip(num / safe, 0.0, 1.0), 1.0)
    np.testing.assert_array_equal(got, want)


def test_ewma_kernel_equals_lfilter():
    x = np.random.default_rng(3).random(500) * 100
    for alpha, state in ((0.1, 5.0), (0.5, 0.0), (0.9, 40.0)):
        want, _ = lfilter([alpha], [1.0, alpha - 1.0], x, zi=[(1.0 - alpha) * state])
        np.testing.assert_allclose(ewma_kernel(x, alpha, state), want, rtol=0, atol=1e-9)


@pytest.fixture(scope="module")
def history() -> OnlineHistory:
    rng = np.random.default_rng(4)
    cfg = CausalConfig(window=600, key_windows=(200,), recent=50, cond_windows=(150,), horizon=20)
    hist = OnlineHistory(cfg)
    n = 900
    prompts = rng.integers(1, 40, n)
    keys = rng.integers(0, 9, n).astype(np.uint64)
    hist.observe(prompts, rng.integers(1, 200, n), keys, np.sort(rng.random(n) * 100))
    return hist


def test_online_column_kernels_equal_their_numpy_definitions(history):
    """Each compiled writer of ``OnlineHistory.features`` against ``key_stat_columns`` and
    ``cond_columns`` applied to the same window tables."""
    cfg = history.cfg
    rng = np.random.default_rng(5)
    n = 300
    prompts = rng.integers(1, 40, n)
    keys = rng.integers(0, 11, n).astype(np.uint64)
    ages = rng.integers(0, 220, n)
    x = history.features(120.0, prompts, ages, keys)
    names = list(cfg.feature_names)
    for src, win in cfg.key_tables:
        table = history.tables[(src, win)]
        q = derive_keys(src, prompts, keys)
        pos = np.clip(np.searchsorted(table.keys, q), 0, max(len(table) - 1, 0))
        hit = (q != 0) & (len(table) > 0) & (table.keys[pos] == q)
        z = np.zeros(n, dtype=np.int64)
        cols = key_stat_columns(
            np.where(hit, table.count[pos], z),
            np.where(hit, table.s1[pos], z),
            np.where(hit, table.s2[pos], z),
            np.where(hit, table.last[pos], z),
            ages,
        )
        first = names.index(f"{src}_w{win}_{KEY_STATS[0]}")
        for j, col in enumerate(cols):
            np.testing.assert_allclose(x[:, first + j], col, rtol=1e-12, equal_nan=True)
    for win in cfg.cond_tables:
        mc = history.marginal[win]
        marginal = (
            np.full(n, float(mc.n)),
            mc.surv(ages),
            mc.surv(ages + cfg.horizon),
            mc.csurv(ages + cfg.horizon) - mc.csurv(ages),
        )
        keyed = [
            history.keyed[(src, win)].query(derive_keys(src, prompts, keys), ages, cfg.horizon)
            for src in cfg.key_sources
        ]
        cols = cond_columns(marginal, keyed, cfg)
        first = names.index(f"marginal_w{win}_{COND_STATS[0]}")
        width = len(COND_STATS) + len(cfg.key_sources) * (len(COND_STATS) + len(EM_STATS))
        assert len(cols) == width
        for j, col in enumerate(cols):
            np.testing.assert_allclose(x[:, first + j], col, rtol=1e-12, equal_nan=True)

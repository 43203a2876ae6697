"""Causal features: online state equals the offline builder, no leakage, bounded state, rows."""

from __future__ import annotations

import numpy as np
import pytest

from balanceroute.features.causal import (
    CausalConfig,
    OnlineHistory,
    hazard_bins,
    person_period_rows,
    trace_period_features,
    trace_snapshot_features,
    training_rows,
)
from balanceroute.features.schema import TraceArrays, to_arrays
from balanceroute.features.synthetic import generate

CFG = CausalConfig(
    window=300,
    recent=40,
    key_windows=(60, 7),
    ewma_halflives=(4, 64),
    cond_windows=(50,),
    horizon=16,
    conversation=True,
)


@pytest.fixture(scope="module", params=["trace", "few-keys"])
def arrays(request) -> TraceArrays:
    """The synthetic trace, and a variant whose keys and prompt lengths repeat a lot."""
    a = to_arrays(generate("mooncake-conv", 1500, seed=5))
    if request.param == "trace":
        return a
    return TraceArrays(
        a.arrival_s,
        a.prompt_tokens // 400 * 400 + 1,
        a.output_tokens,
        (a.prompt_key % np.uint64(23)) + np.uint64(1),
    )


def _snapshots(arrays: TraceArrays, n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, arrays.size, n)
    age = np.floor(rng.random(n) * arrays.output_tokens[idx]).astype(np.int64)
    return idx, age


ENDS = hazard_bins(CFG.horizon, 6)


def test_online_state_matches_offline_builder(arrays):
    """Observing completions in time order (in uneven batches) gives the offline features: the
    snapshot features and the hazard model's per-bin period features."""
    idx, age = _snapshots(arrays, 150)
    offline = trace_snapshot_features(arrays, idx, age, CFG)
    periods = trace_period_features(arrays, idx, age, CFG, ENDS)
    assert periods.shape == (idx.size, ENDS.size, len(CFG.period_feature_names))
    assert np.isfinite(periods).any(axis=(0, 1)).all()
    # the stacked empirical answers and the time since a key's last completion are covered
    names = list(CFG.feature_names)
    covered = ("marginal_w50_cond_p", "hash_w300_em_p", "hash_w300_cond_p", "hash_since_last_s")
    for name in (*covered, "hash_prev_prompt", "hash_prompt_growth", "hash_new_tokens"):
        assert np.isfinite(offline[:, names.index(name)]).any(), name
    t = CFG.snapshot_times(arrays, idx, age)
    finish = CFG.finish_times(arrays)
    order = np.argsort(finish, kind="stable")
    fin_sorted = finish[order]
    hist = OnlineHistory(CFG)
    rng = np.random.default_rng(1)
    seen = 0
    for q in np.argsort(t):
        upto = int(np.searchsorted(fin_sorted, t[q], side="left"))
        while seen < upto:
            m = min(upto - seen, int(rng.integers(1, 500)))
            sel = order[seen : seen + m]
            hist.observe(
                arrays.prompt_tokens[sel],
                arrays.output_tokens[sel],
                arrays.prompt_key[sel],
                finish[sel],
            )
            seen += m
        prompt, key = arrays.prompt_tokens[idx[[q]]], arrays.prompt_key[idx[[q]]]
        row = hist.features(float(t[q]), prompt, age[[q]], key)[0]
        np.testing.assert_allclose(row, offline[q], rtol=1e-9, atol=1e-9, equal_nan=True)
        per = hist.period_features(prompt, age[[q]], key, ENDS)[0]
        np.testing.assert_allclose(per, periods[q], rtol=1e-12, atol=0, equal_nan=True)


def test_no_leakage_from_a_future_request(arrays):
    """Changing a request's output changes no feature of snapshots taken before it finished."""
    target = arrays.size // 2
    finish = CFG.finish_times(arrays)
    idx, age = _snapshots(arrays, 600, seed=2)
    t = CFG.snapshot_times(arrays, idx, age)
    before = trace_snapshot_features(arrays, idx, age, CFG)
    out = arrays.output_tokens.copy()
    out[target] += 1  # finishes one step later, with a different length
    changed = TraceArrays(arrays.arrival_s, arrays.prompt_tokens, out, arrays.prompt_key)
    after = trace_snapshot_features(changed, idx, age, CFG)
    past = t <= finish[target]
    assert past.any() and (~past).any()
    np.testing.assert_array_equal(before[past], after[past])
    assert not np.allclose(before[~past], after[~past], equal_nan=True)


def test_online_memory_is_bounded(arrays):
    hist = OnlineHistory(CFG)
    finish = CFG.finish_times(arrays)
    order = np.argsort(finish)
    for lo in range(0, arrays.size, 100):
        sel = order[lo : lo + 100]
        hist.observe(
            arrays.prompt_tokens[sel],
            arrays.output_tokens[sel],
            arrays.prompt_key[sel],
            finish[sel],
        )
    assert hist.out.size == CFG.window
    for (_, win), table in hist.tables.items():
        assert len(table) <= win
        assert table.count.sum() == min(win, arrays.size)
    for (_, win), keyed in hist.keyed.items():  # stacked empirical features: same windows
        assert keyed.comp.size <= win
    for win, marginal in hist.marginal.items():
        assert marginal.n == min(win, arrays.size)


def test_training_rows_grid_cap_and_weights():
    out = np.array([1, 7, 8, 9, 400])
    req, age, w = training_rows(out, step=4, per_request=5, max_rows=10_000, seed=0)
    assert np.all(age < out[req]) and np.all(age % 4 == 0)
    np.testing.assert_allclose(np.bincount(req, weights=w), np.ones(out.size))
    assert np.bincount(req).max() == 5
    big = np.full(100_000, 1000)
    req, age, w = training_rows(big, step=8, per_request=32, max_rows=50_000, seed=0)
    assert req.size <= 50_000 and np.unique(req).size > 1000


@pytest.mark.parametrize("step, per_request", [(1, 10_000), (4, 5), (8, 32)])
def test_training_rows_at_risk_weigh_each_request_by_its_running_time(step, per_request):
    """With ``at_risk`` a request's rows weigh in total its output length (the iterations a
    router meets it running), whatever its grid or how many snapshots it keeps; without, every
    request weighs the same."""
    out = np.array([1, 2, 7, 8, 9, 63, 64, 65, 400, 3000])
    req, _, w = training_rows(out, step=step, per_request=per_request, seed=1, at_risk=True)
    total = np.bincount(req, weights=w, minlength=out.size)
    np.testing.assert_allclose(total / total.sum(), out / out.sum())
    assert w.mean() == pytest.approx(1.0)
    req, _, w = training_rows(out, step=step, per_request=per_request, seed=1, at_risk=False)
    np.testing.assert_allclose(np.bincount(req, weights=w, minlength=out.size), 1.0)


def test_person_period_rows_cover_each_bin_at_risk():
    """One row per bin a snapshot is at risk in, the event in the bin holding ``r``, none after;
    thinning keeps every event and reweights the rest."""
    ends = np.array([1, 2, 4, 8])
    r = np.array([1, 2, 3, 8, 9, 100])
    snap, j, event, w = person_period_rows(r, ends)
    assert np.bincount(snap).tolist() == [1, 2, 3, 4, 4, 4]
    assert event.tolist() == [1, 0, 1, 0, 0, 1, 0, 0, 0, 1] + [0] * 8
    assert (w == 1).all()
    lo = np.r_[0, ends][j]
    hit = event == 1
    assert ((r[snap][hit] > lo[hit]) & (r[snap][hit] <= ends[j][hit])).all()
    assert (r[snap][~hit] > ends[j][~hit]).all()
    big = np.random.default_rng(0).integers(1, 200, 20_000)
    full = person_period_rows(big, ends)
    thin = person_period_rows(big, ends, survivor_fraction=0.25, seed=1)
    assert thin[2].sum() == full[2].sum()  # every event kept
    assert thin[0].size < 0.5 * full[0].size
    np.testing.assert_allclose((thin[3] * (1 - thin[2])).sum(), (1 - full[2]).sum(), rtol=0.02)

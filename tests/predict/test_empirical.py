"""Hand-computed survival and exactmatch cases, the out-of-support rule, bounded windows."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.errors import UserError
from balanceroute.features.synthetic import generate
from balanceroute.predict.base import CompletedBatch, RunningBatch
from balanceroute.predict.exactmatch import ExactMatchEstimator
from balanceroute.predict.survival import SurvivalEstimator


def _trace(prompts, outputs, keys=None) -> pd.DataFrame:
    n = len(outputs)
    return pd.DataFrame(
        {
            "request_id": [str(i) for i in range(n)],
            "arrival_s": np.arange(n, dtype=float),
            "prompt_tokens": prompts,
            "output_tokens": outputs,
            "prompt_key": keys if keys is not None else [None] * n,
        }
    )


def _batch(prompts, ages) -> RunningBatch:
    return RunningBatch(np.asarray(prompts, np.int64), np.asarray(ages, np.int64))


def test_survival_hand_computed():
    est = SurvivalEstimator(horizon=2).fit(_trace([5, 5, 5, 5], [1, 2, 3, 4]))
    pred = est.predict(_batch([5, 5, 5], [0, 2, 4]), survival=True)
    # S(x) = #outputs > x: S(0)=4 S(1)=3 S(2)=2 S(3)=1 S(4)=0
    np.testing.assert_allclose(pred.p_finish, [0.5, 1.0, 0.0])
    np.testing.assert_allclose(pred.c, [(4 + 3) / 4, (2 + 1) / 2, 2.0])
    np.testing.assert_allclose(pred.survival[0], [1.0, 3 / 4, 2 / 4])
    np.testing.assert_allclose(pred.survival[2], [1.0, 1.0, 1.0])  # beyond support: survives


def _em_trace():
    return _trace([7, 7, 7, 9, 9], [10, 10, 10, 100, 100])


def test_exactmatch_switch_hand_computed():
    est = ExactMatchEstimator(horizon=5, key="exact-length", blend="switch").fit(_em_trace())
    pred = est.predict(_batch([7, 7, 8], [0, 6, 0]))
    np.testing.assert_allclose(pred.p_finish, [0.0, 1.0, 0.0])
    np.testing.assert_allclose(pred.c, [5.0, 4.0, 5.0])


def test_exactmatch_shrink_hand_computed():
    est = ExactMatchEstimator(horizon=5, key="exact-length", prior=1.0).fit(_em_trace())
    pred = est.predict(_batch([7], [6]))
    # key: S(6)=3, S(11)=0, sum min(o-6,5)=12; marginal/5: S(6)=1, S(11)=0.4, CS=(5+5+5+5+2)/5
    den = 3 + 1.0
    np.testing.assert_allclose(pred.p_finish, [1 - 0.4 / den])
    np.testing.assert_allclose(pred.c, [(12 + 22 / 5) / den])


def test_exactmatch_bucket_and_hash_keys():
    trace = generate("mooncake-conv", 400, seed=1)
    for key in ("bucket", "hash", "exact-length"):
        est = ExactMatchEstimator(horizon=20, key=key).fit(trace)
        pred = est.predict(_batch(trace["prompt_tokens"][:10], np.zeros(10)))
        assert np.all((pred.c >= 1) & (pred.c <= 20))


def test_unknown_key_and_blend():
    with pytest.raises(UserError, match="known key sources"):
        ExactMatchEstimator(key="nope")
    with pytest.raises(UserError, match="known blends"):
        ExactMatchEstimator(blend="nope")


def test_observe_window_is_bounded_and_matches_refit():
    trace = generate("mooncake-conv", 300, seed=2)
    window = 50
    online = ExactMatchEstimator(horizon=10, key="hash", window=window).fit(trace.iloc[:100])
    rest = trace.iloc[100:]
    from balanceroute.features.schema import to_arrays

    a = to_arrays(rest)
    for lo in range(0, a.size, 37):
        sl = slice(lo, lo + 37)
        online.observe(CompletedBatch(a.prompt_tokens[sl], a.output_tokens[sl], a.prompt_key[sl]))
    assert len(online.window_) == window
    assert online.keyed_.comp.size <= window
    assert online.marginal_.n == window
    # the window holds the last 50 completions, as a fit on them would
    ref = ExactMatchEstimator(horizon=10, key="hash", window=window, assumed_tpot_s=0.0)
    ref.fit(rest.iloc[-window:].assign(arrival_s=np.arange(window, dtype=float)))
    batch = RunningBatch(a.prompt_tokens[:40], np.arange(40) % 7, a.prompt_key[:40])
    np.testing.assert_allclose(online.predict(batch).p_finish, ref.predict(batch).p_finish)

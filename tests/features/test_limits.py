"""Input limits: defined once (``features.limits``), overridable within ceilings, enforced by the
loaders (naming the file's own column), by every estimator's online update, and by histograms
that cannot grow past a fixed size yet answer exactly below it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.errors import TraceError, UserError
from balanceroute.features.limits import CEILINGS, InputLimits, input_limits, limits_from_env
from balanceroute.features.loaders import load_trace
from balanceroute.features.synthetic import generate
from balanceroute.features.windows import MarginalCounts
from balanceroute.predict.base import CompletedBatch, InputOutOfRange, RunningBatch
from balanceroute.predict.registry import estimator_class, estimator_names, make_estimator

LIMITS = input_limits()


def test_defaults_and_overrides() -> None:
    assert limits_from_env({}) == InputLimits()
    env = {"BALANCEROUTE_MAX_OUTPUT_TOKENS": "4096", "BALANCEROUTE_MAX_ARRIVAL_S": "1e6"}
    got = limits_from_env(env)
    assert got.max_output_tokens == 4096 and got.max_arrival_s == 1e6
    for bad in ("1e10", "abc", "-5", "0", str(CEILINGS["max_output_tokens"] + 1)):
        with pytest.raises(UserError, match="BALANCEROUTE_MAX_OUTPUT_TOKENS"):
            limits_from_env({"BALANCEROUTE_MAX_OUTPUT_TOKENS": bad})
    with pytest.raises(UserError, match="BALANCEROUTE_MAX_ARRIVAL_S"):
        limits_from_env({"BALANCEROUTE_MAX_ARRIVAL_S": "inf"})


@settings(max_examples=60, deadline=None)
@given(
    outputs=st.lists(st.integers(1, 400), min_size=1, max_size=60),
    removed=st.integers(0, 30),
    cap=st.integers(2, 300),
    x=st.lists(st.integers(0, 500), min_size=1, max_size=20),
)
def test_tail_bucket_keeps_answers_below_the_cap(outputs, removed, cap, x) -> None:
    """Counts with a cap equal the uncapped ones for every x below the cap, after additions
    and removals alike, and the histogram never outgrows the cap."""
    out = np.asarray(outputs, dtype=np.int64)
    gone = out[: min(removed, out.size)]
    capped, free = MarginalCounts(cap=cap), MarginalCounts(cap=10**6)
    for m in (capped, free):
        m.add(out, 1)
        m.add(gone, -1)
    xs = np.asarray(x, dtype=np.int64)
    below = xs[xs < cap]
    np.testing.assert_array_equal(capped.surv(below), free.surv(below))
    upto = xs[xs <= cap]
    np.testing.assert_array_equal(capped.csurv(upto), free.csurv(upto))
    assert capped.hist.size <= cap + 2
    assert capped.n == free.n


def test_a_huge_output_does_not_grow_the_histogram() -> None:
    m = MarginalCounts()
    m.add(np.array([2**31 - 1, 2**40], dtype=np.int64))
    assert m.hist.size <= LIMITS.max_output_tokens + 2
    assert m.surv(np.array([0]))[0] == 2


ONLINE = [n for n in estimator_names() if estimator_class(n).learns_online]


@pytest.mark.parametrize("name", ONLINE)
def test_every_online_update_refuses_lengths_beyond_the_limits(name: str) -> None:
    trace = generate("paper-prod", 300, seed=1)
    params = {  # small fits: the limits are checked before any model is touched
        "gbdt": {"n_estimators": 10, "per_request": 2},
        "hazard": {"n_estimators": 10},
    }.get(name, {})
    est = make_estimator(name, **params)
    est = est.fit(trace)
    batch = RunningBatch(np.array([100, 2000]), np.array([0, 50]), np.array([0, 1], np.uint64))
    before = est.predict(batch)
    for prompt, output in (
        (100, LIMITS.max_output_tokens + 1),
        (LIMITS.max_prompt_tokens + 1, 10),
        (5, 0),
    ):
        done = CompletedBatch(np.array([10, prompt]), np.array([10, output]), None, None)
        with pytest.raises(InputOutOfRange):
            est.observe(done)
    after = est.predict(batch)  # nothing was taken in
    np.testing.assert_array_equal(before.p_finish, after.p_finish)
    np.testing.assert_array_equal(before.c, after.c)


@pytest.mark.parametrize(
    ("name", "content", "column"),
    [
        (
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,2147483647\n",
            "GeneratedTokens",
        ),
        (
            "a.csv",
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,1e30,4\n",
            "ContextTokens",
        ),
        (
            "m.jsonl",
            '{"timestamp": 0, "input_length": 10, "output_length": 9223372036854775807, '
            '"hash_ids": [1]}\n',
            "output_length",
        ),
        ("c.csv", "arrival_s,prompt_tokens,output_tokens\n1e30,5,5\n", "arrival_s"),
    ],
)
def test_loaders_name_the_files_own_column(tmp_path: Path, name, content, column) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(TraceError) as info:
        load_trace(path)
    message = str(info.value)
    assert f"field '{column}'" in message and "row 1" in message
    assert "-9223372036854775808" not in message


def test_a_trace_at_the_limits_loads(tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    frame = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0],
            "prompt_tokens": [LIMITS.max_prompt_tokens, 1],
            "output_tokens": [1, LIMITS.max_output_tokens],
        }
    )
    frame.to_csv(path, index=False)
    assert load_trace(path)["output_tokens"].max() == LIMITS.max_output_tokens

"""The fast body decoders accept exactly what the strict pydantic models accept (no server)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from balanceroute.features.limits import input_limits
from balanceroute.serving.lifecycle.recent import RecentCompletions
from balanceroute.serving.service.decode import CompletedColumns, fast_observe, fast_predict
from balanceroute.serving.service.schemas import ObserveRequest, PredictRequest

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=5),
    st.lists(st.integers(), max_size=2),
)


def mostly(valid: st.SearchStrategy, bad: st.SearchStrategy = ANY) -> st.SearchStrategy:
    """``valid`` nine times in ten, else ``bad``: most bodies get through, some do not."""
    return st.integers(0, 9).flatmap(lambda i: bad if i == 0 else valid)


def record(required: dict, optional: dict) -> st.SearchStrategy[dict]:
    """Objects with their required fields (mostly), optional ones, and now and then an extra."""
    fields = {k: mostly(v) for k, v in {**required, **optional}.items()}
    full = st.fixed_dictionaries(
        {k: fields[k] for k in required},
        optional={**{k: fields[k] for k in optional}, "extra": ANY},
    )
    return mostly(full, st.fixed_dictionaries({}, optional=fields))


_LIM = input_limits()
_EDGES = [
    v + d for v in (_LIM.max_prompt_tokens, _LIM.max_output_tokens) for d in (-1, 0, 1)
]  # the input limits, where the fast path and the models must agree exactly
TOKENS = st.one_of(st.integers(min_value=0, max_value=2**31), st.sampled_from(_EDGES))
KEY = st.one_of(st.none(), st.integers(min_value=-1, max_value=2**64 - 1), st.text(max_size=5))
ID = st.one_of(st.integers(min_value=-(2**63), max_value=2**64 - 1), st.text(max_size=5))
RUNNING = record({"id": ID, "prompt_tokens": TOKENS, "age": TOKENS}, {"prompt_key": KEY})
PREDICT = record(
    {"requests": st.lists(RUNNING, max_size=5)},
    {
        "model": st.text(max_size=5),
        "survival": st.booleans(),
        "time_s": st.floats(min_value=-1, max_value=1.1e12),
        "horizon": st.integers(min_value=0, max_value=1025),
    },
)
COMPLETED = record(
    {"prompt_tokens": TOKENS, "output_tokens": TOKENS},
    {"prompt_key": KEY, "time_s": st.floats(min_value=-1, max_value=10)},
)
OBSERVE = record({"completions": st.lists(COMPLETED, max_size=5)}, {})


def _same(a, b) -> bool:
    for name in a.__dataclass_fields__:
        x, y = getattr(a, name), getattr(b, name)
        if hasattr(x, "__dataclass_fields__"):
            if not _same(x, y):
                return False
        elif isinstance(x, np.ndarray) or isinstance(y, np.ndarray):
            if x is None or y is None or x.dtype != y.dtype:
                return False
            if not np.array_equal(x, y, equal_nan=x.dtype.kind == "f"):
                return False
        elif x != y or type(x) is not type(y):
            return False
    return True


def _fast_agrees_with_the_model(fast_decode, model: type, data) -> None:
    """The fast decoder answers what the pydantic model accepts, and None for what it refuses."""
    fast = fast_decode(data)
    try:
        checked = model.model_validate(data)
    except ValidationError:
        assert fast is None
        return
    again = fast_decode(checked.model_dump(exclude_unset=True))
    assert again is not None
    if fast is not None:
        assert _same(fast, again)


@settings(max_examples=400, deadline=None)
@given(PREDICT)
def test_fast_predict_agrees_with_the_model(data) -> None:
    _fast_agrees_with_the_model(fast_predict, PredictRequest, data)


@settings(max_examples=400, deadline=None)
@given(OBSERVE)
def test_fast_observe_agrees_with_the_model(data) -> None:
    _fast_agrees_with_the_model(fast_observe, ObserveRequest, data)


@pytest.mark.parametrize("capacity", [0, 1, 5, 64])
def test_the_completion_log_keeps_the_last_rows_in_order(capacity: int) -> None:
    log = RecentCompletions(capacity)
    rows = np.arange(1, 40)
    for chunk in np.array_split(rows, [3, 4, 20, 21]):
        log.add(CompletedColumns(chunk, chunk * 10, chunk.astype(np.uint64), None))
    kept = log.batch()
    assert np.array_equal(kept.prompt_tokens, rows[len(rows) - min(capacity, len(rows)) :])
    assert np.array_equal(kept.output_tokens, kept.prompt_tokens * 10)
    assert np.isnan(kept.time_s).all()


def test_a_worker_with_nothing_running_decodes_to_empty_columns() -> None:
    from balanceroute.serving.service.decode import running_columns

    cols = running_columns([])
    assert cols is not None and cols.size == 0 and cols.ids == []
    assert cols.prompt_key.dtype == np.uint64


def test_raw_keys_hash_like_the_trace_loaders_and_the_memo_stays_bounded() -> None:
    from balanceroute.features.schema import hash_keys
    from balanceroute.serving.service.decode import KeyHasher

    hasher = KeyHasher(capacity=4, cached_length=3)
    keys = ["a", "bb", "a", "long-key", "ccc", "dd", "e", "a"]
    for _ in range(2):
        assert np.array_equal(hasher(keys), hash_keys(keys))
        assert len(hasher.known) <= 4 and all(len(k) <= 3 for k in hasher.known)

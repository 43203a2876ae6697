"""The schema's shared checks: file rows in messages, and missing keys that stay missing."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.errors import TraceError
from balanceroute.features.schema import as_seconds, as_token_counts, to_arrays, validate_trace


def test_token_counts_name_the_file_row():
    values = pd.Series([3, 4, 0])
    with pytest.raises(TraceError, match=r"f\.csv, row 12, field 'len': must be at least 1"):
        as_token_counts(values, source="f.csv", field="len", rows=np.array([10, 11, 12]))
    assert as_token_counts(pd.Series(["7", 8.0])).tolist() == [7, 8]


def test_seconds_reject_text():
    with pytest.raises(TraceError, match=r"row 2, field 'ts': unparseable arrival time 'x'"):
        as_seconds(pd.Series(["1.5", "x"]), field="ts")


@pytest.mark.parametrize("dtype", ["str", object])
def test_missing_keys_stay_missing(dtype):
    frame = pd.DataFrame(
        {
            "arrival_s": [0.0, 1.0, 2.0],
            "prompt_tokens": [1, 2, 3],
            "output_tokens": [1, 1, 1],
            "prompt_key": pd.Series(["a", None, "b"], dtype=dtype),
        }
    )
    trace = validate_trace(frame)
    assert trace["prompt_key"].isna().tolist() == [False, True, False]
    assert to_arrays(trace).prompt_key[1] == 0


def test_validate_reports_rows_in_file_order_before_sorting():
    frame = pd.DataFrame(
        {"arrival_s": [5.0, 1.0, 3.0], "prompt_tokens": [1, 2, 3], "output_tokens": [1, 1, -1]}
    )
    with pytest.raises(TraceError, match=r"row 3, field 'output_tokens'"):
        validate_trace(frame, source="t.csv")

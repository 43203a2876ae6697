"""Every reader on small files it can check by hand, format detection, limit and keys."""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd
import pytest

from balanceroute.features.errors import DroppedRowsWarning, UserError
from balanceroute.features.loaders import detect_format, format_names, load_trace
from balanceroute.features.schema import CANONICAL_COLUMNS, validate_trace
from tests.features.trace_fixtures import AZURE_2023, AZURE_2024, BURSTGPT, CANONICAL_CSV, MOONCAKE


def test_azure_2023_layout_keeps_100ns_digits(write):
    trace = load_trace(write("conv.csv", AZURE_2023))
    assert list(trace.columns) == list(CANONICAL_COLUMNS)
    np.testing.assert_allclose(trace["arrival_s"], [0.0, 4.314579, 4.5418771], atol=1e-9)
    assert trace["prompt_tokens"].tolist() == [374, 396, 879]
    assert trace["output_tokens"].tolist() == [44, 109, 55]
    assert trace["request_id"].tolist() == ["0", "1", "2"]
    assert trace["prompt_key"].isna().all()


def test_azure_2024_layout_with_offsets_and_no_fraction(write):
    trace = load_trace(write("code_1week.csv", AZURE_2024))
    np.testing.assert_allclose(trace["arrival_s"], [0.0, 0.012384, 0.99007], atol=1e-9)
    assert trace["request_id"].tolist() == ["0", "2", "1"]
    assert trace["prompt_tokens"].tolist() == [2162, 76, 2399]


def test_mooncake_keys_are_leading_hash_blocks(write):
    path = write("conv.jsonl", MOONCAKE)
    trace = load_trace(path)
    assert trace["arrival_s"].tolist() == [0.0, 3.0, 3.0, 6.5]
    assert trace["prompt_key"].tolist() == ["0-1", "0-14", "0-1", "0"]
    three = load_trace(path, key_blocks=3)["prompt_key"].tolist()
    assert three == ["0-1-2", "0-14-15", "0-1-2", "0"]
    assert load_trace(path, key_blocks=1)["prompt_key"].nunique() == 1


def test_mooncake_empty_hash_list_gives_no_key(write):
    line = '{"timestamp": 5, "input_length": 10, "output_length": 2, "hash_ids": []}\n'
    trace = load_trace(write("t.jsonl", line))
    assert trace["prompt_key"].isna().all()
    assert trace["arrival_s"].tolist() == [0.0]


def test_burstgpt_drops_failed_requests_with_a_warning(write):
    with pytest.warns(DroppedRowsWarning, match="dropped 1 failed request"):
        trace = load_trace(write("burst.csv", BURSTGPT))
    assert trace["request_id"].tolist() == ["0", "2", "3"]
    assert trace["arrival_s"].tolist() == [0.0, 113.0, 115.0]
    assert trace["prompt_tokens"].tolist() == [472, 417, 20]
    assert trace["output_tokens"].tolist() == [18, 276, 7]


def test_burstgpt_limit_counts_kept_requests(write):
    with pytest.warns(DroppedRowsWarning):
        trace = load_trace(write("burst.csv", BURSTGPT), limit=2)
    assert trace["request_id"].tolist() == ["0", "2"]


def test_burstgpt_without_failures_warns_nothing(write):
    clean = "".join(line for line in BURSTGPT.splitlines(True) if ",0,1087" not in line)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert len(load_trace(write("burst.csv", clean))) == 3


def test_canonical_csv_keeps_text_keys_and_empty_cells(write):
    trace = load_trace(write("t.csv", CANONICAL_CSV))
    assert trace["request_id"].tolist() == ["a", "b", "c"]
    assert trace["arrival_s"].tolist() == [0.0, 0.5, 1.25]
    assert trace["prompt_key"].iloc[0] == "tmpl-1"
    assert pd.isna(trace["prompt_key"].iloc[1])
    assert trace["prompt_key"].iloc[2] == "NA"


def _frame() -> pd.DataFrame:
    return pd.DataFrame(
        {
            "request_id": ["r0", "r1", "r2"],
            "arrival_s": [0.0, 0.1, 0.30000000000000004],
            "prompt_tokens": [5, 6, 7],
            "output_tokens": [1, 2, 3],
            "prompt_key": ["k", None, "k"],
        }
    )


def test_canonical_parquet(tmp_path):
    path = tmp_path / "t.parquet"
    _frame().to_parquet(path, index=False)
    pd.testing.assert_frame_equal(load_trace(path), validate_trace(_frame()))


def test_canonical_jsonl_with_optional_columns_absent(write):
    lines = '{"arrival_s": 0.5, "prompt_tokens": 3, "output_tokens": 1}\n\n'
    lines += '{"arrival_s": 0.0, "prompt_tokens": 4, "output_tokens": 2}\n'
    trace = load_trace(write("t.jsonl", lines))
    assert trace["request_id"].tolist() == ["1", "0"]
    assert trace["prompt_tokens"].tolist() == [4, 3]


def test_canonical_arrivals_are_not_shifted(write):
    text = "arrival_s,prompt_tokens,output_tokens\n10.5,1,1\n11,2,2\n"
    assert load_trace(write("t.csv", text))["arrival_s"].tolist() == [10.5, 11.0]


@pytest.mark.parametrize(
    ("name", "content", "expected"),
    [
        ("a.csv", AZURE_2023, "azure"),
        ("b.txt", AZURE_2024, "azure"),
        ("c.jsonl", MOONCAKE, "mooncake"),
        ("d.csv", BURSTGPT, "burstgpt"),
        ("e.csv", CANONICAL_CSV, "canonical"),
        ("f.jsonl", '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n', "canonical"),
        ("g.data", "TIMESTAMP,ContextTokens,GeneratedToken\n", "azure"),
    ],
)
def test_detect_format_by_content(write, name, content, expected):
    assert detect_format(write(name, content)) == expected


def test_detect_format_parquet_by_magic(tmp_path):
    path = tmp_path / "no_extension"
    _frame().to_parquet(path, index=False)
    assert detect_format(path) == "canonical"


def test_forced_format_must_fit_the_syntax(write):
    path = write("c.jsonl", MOONCAKE)
    assert len(load_trace(path, format="mooncake")) == 4
    with pytest.raises(UserError, match="format 'azure' reads CSV, but this file is JSONL"):
        load_trace(path, format="azure")
    with pytest.raises(UserError, match="unknown trace format 'excel'; known formats: auto, "):
        load_trace(path, format="excel")


def test_format_names_are_registered():
    assert format_names() == ["azure", "mooncake", "burstgpt", "canonical"]


@pytest.mark.parametrize(("name", "content"), [("a.csv", AZURE_2023), ("c.jsonl", MOONCAKE)])
def test_limit_reads_the_first_requests(write, name, content):
    trace = load_trace(write(name, content), limit=2)
    assert trace["request_id"].tolist() == ["0", "1"]


def test_bad_options_are_user_errors(write):
    path = write("c.jsonl", MOONCAKE)
    with pytest.raises(UserError, match="key_blocks must be at least 1"):
        load_trace(path, key_blocks=0)
    with pytest.raises(UserError, match="limit must be at least 1"):
        load_trace(path, limit=0)


def test_chunked_reads_keep_file_rows(write, monkeypatch):
    monkeypatch.setattr("balanceroute.features.loaders.common.CHUNK_ROWS", 2)
    monkeypatch.setattr("balanceroute.features.loaders.common.JSONL_CHUNK_ROWS", 2)
    rows = "".join(f"2023-11-16 18:15:{i:02d}.0,{i + 1},1\n" for i in range(7))
    path = write("a.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n" + rows + "x,1,1\n")
    with pytest.raises(UserError, match=r"row 8, field 'TIMESTAMP'"):
        load_trace(path)
    assert load_trace(path, limit=7)["prompt_tokens"].tolist() == list(range(1, 8))
    lines = "".join(
        f'{{"timestamp": {i}, "input_length": {i + 1}, "output_length": 1, "hash_ids": [{i}]}}\n'
        for i in range(5)
    )
    assert len(load_trace(write("m.jsonl", lines))) == 5


def _part(rows: list[tuple[str, float, int, int, str]]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(CANONICAL_COLUMNS))


def test_a_folder_reads_as_the_union_of_its_parts_in_arrival_order(tmp_path):
    folder = tmp_path / "completions"
    folder.mkdir()
    _part([("b", 5.0, 10, 3, "k1"), ("c", 9.0, 20, 4, "k2")]).to_parquet(folder / "part-2.parquet")
    _part([("a", 1.0, 30, 5, "k1")]).to_parquet(folder / "part-1.parquet")
    (folder / "log.json").write_text("{}")  # not a part
    (folder / ".part-3.parquet.tmp").write_text("half written")  # not a part either
    trace = load_trace(folder)
    assert trace["request_id"].tolist() == ["a", "b", "c"]
    assert trace["output_tokens"].tolist() == [5, 3, 4]
    assert detect_format(folder) == "canonical"
    assert load_trace(folder, limit=2)["request_id"].tolist() == ["a", "b"]


def test_a_folder_without_parts_names_itself(tmp_path):
    with pytest.raises(UserError, match="no trace parts") as err:
        load_trace(tmp_path)
    assert str(tmp_path) in str(err.value)


def test_a_bad_part_names_its_file(tmp_path):
    _part([("a", 1.0, 0, 5, "k")]).to_parquet(tmp_path / "part-1.parquet")
    with pytest.raises(UserError, match=r"part-1\.parquet"):
        load_trace(tmp_path)

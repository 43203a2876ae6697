"""Bad input of every kind ends in one line naming file, row and field, and exit code 2.

Row numbers are 1-based data rows: row 1 is the first request (a CSV header is not a row).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from balanceroute.features.errors import TraceError
from balanceroute.features.loaders import load_trace
from tests.features.trace_fixtures import AZURE_2023, BURSTGPT, MOONCAKE

AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
CANONICAL_HEADER = "arrival_s,prompt_tokens,output_tokens\n"
GOOD_AZURE_ROW = "2023-11-16 18:15:46.6805900,374,44\n"

# (file name, content, fragments the error line must hold besides the path)
CASES = {
    "missing column": (
        "a.csv",
        "TIMESTAMP,ContextTokens\n" + "2023-11-16 18:15:46.6805900,374\n",
        ["field 'GeneratedTokens'", "missing column 'GeneratedTokens'"],
    ),
    "misspelt column": (
        "a.csv",
        "TIMESTAMP,ContextTokens,GeneratedToken\n" + GOOD_AZURE_ROW,
        ["missing column 'GeneratedTokens' (did you mean 'GeneratedToken'?)"],
    ),
    "misspelt column, other case": (
        "a.csv",
        "Timestamp,ContextTokens,GeneratedTokens\n" + GOOD_AZURE_ROW,
        ["missing column 'TIMESTAMP' (did you mean 'Timestamp'?)"],
    ),
    "non-integer length": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.0,12.5,3\n",
        ["row 2", "field 'ContextTokens'", "whole number", "12.5"],
    ),
    "text length": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW * 2 + "2023-11-16 18:15:47.0,12,many\n",
        ["row 3", "field 'GeneratedTokens'", "'many'"],
    ),
    "empty length cell": (
        "a.csv",
        AZURE_HEADER + "2023-11-16 18:15:47.0,,3\n",
        ["row 1", "field 'ContextTokens'", "an empty value"],
    ),
    "zero length": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW * 2 + "2023-11-16 18:15:47.0,12,0\n",
        ["row 3", "field 'GeneratedTokens'", "at least 1, got 0"],
    ),
    "negative length": (
        "a.csv",
        AZURE_HEADER + "2023-11-16 18:15:47.0,-4,3\n",
        ["row 1", "field 'ContextTokens'", "got -4"],
    ),
    "unparseable timestamp": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "yesterday noon,12,3\n",
        ["row 2", "field 'TIMESTAMP'", "unparseable timestamp 'yesterday noon'"],
    ),
    "unterminated quote": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW * 2 + '2023-11-16 18:15:47.0,"12,3\n' + GOOD_AZURE_ROW,
        ["row 3", "malformed CSV", "EOF inside string"],
    ),
    "short csv row": (
        "a.csv",
        AZURE_HEADER + GOOD_AZURE_ROW + "2023-11-16 18:15:47.0,12\n",
        ["row 2", "field 'GeneratedTokens'", "an empty value"],
    ),
    "header only": ("a.csv", AZURE_HEADER, ["holds no requests"]),
    "empty file": ("a.csv", "", ["the file is empty"]),
    "blank lines only": ("a.csv", "\n\n  \n", ["empty"]),
    "binary file": ("a.csv", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", ["binary file"]),
    "gzip file": ("a.csv.gz", b"\x1f\x8b\x08\x00\x00\x00\x00\x00", ["gzip"]),
    "unknown layout": ("a.csv", "name,age\nbob,3\n", ["cannot tell the trace format"]),
    "jsonl line not json": (
        "m.jsonl",
        MOONCAKE.splitlines(True)[0] * 2 + '{"timestamp": 1, "input_length": \n',
        ["row 3", "not valid JSON"],
    ),
    "jsonl line not an object": (
        "m.jsonl",
        MOONCAKE.splitlines(True)[0] + "[1, 2]\n",
        ["row 2", "expected a JSON object"],
    ),
    "jsonl misspelt field": (
        "m.jsonl",
        MOONCAKE.splitlines(True)[0]
        + '{"timestamp": 1, "input_length": 5, "output_len": 2, "hash_ids": [0]}\n',
        ["row 2", "field 'output_length'", "did you mean 'output_len'?"],
    ),
    "mooncake bad timestamp": (
        "m.jsonl",
        '{"timestamp": "soon", "input_length": 5, "output_length": 2, "hash_ids": [0]}\n',
        ["row 1", "field 'timestamp'", "'soon'"],
    ),
    "mooncake float length": (
        "m.jsonl",
        MOONCAKE + '{"timestamp": 9, "input_length": 5.5, "output_length": 2, "hash_ids": [0]}\n',
        ["row 5", "field 'input_length'", "5.5"],
    ),
    "mooncake hashes not a list": (
        "m.jsonl",
        '{"timestamp": 1, "input_length": 5, "output_length": 2, "hash_ids": 7}\n',
        ["row 1", "field 'hash_ids'", "list of block hashes"],
    ),
    "burstgpt bad length after a failed row": (
        "b.csv",
        BURSTGPT + "130,GPT-4,lots,7,27,API log\n",
        ["row 5", "field 'Request tokens'", "'lots'"],
    ),
    "burstgpt bad timestamp": (
        "b.csv",
        BURSTGPT.replace("118,GPT-4", "later,GPT-4"),
        ["row 3", "field 'Timestamp'", "'later'"],
    ),
    "canonical negative arrival": (
        "c.csv",
        CANONICAL_HEADER + "0.5,1,1\n-2,1,1\n",
        ["row 2", "field 'arrival_s'", ">= 0"],
    ),
    "canonical nan length": (
        "c.csv",
        CANONICAL_HEADER + "0.5,1,1\n0.7,nan,1\n",
        ["row 2", "field 'prompt_tokens'", "'nan'"],
    ),
    "canonical jsonl bad length": (
        "c.jsonl",
        '{"arrival_s": 0, "prompt_tokens": 1, "output_tokens": 1}\n'
        '{"arrival_s": 1, "prompt_tokens": 0, "output_tokens": 1}\n',
        ["row 2", "field 'prompt_tokens'", "at least 1"],
    ),
}


def _make(tmp_path: Path, name: str, content: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


def _assert_one_line(code: int, err: str, path: Path, fragments: list[str]) -> None:
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert str(path) in lines[0]
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    assert "Traceback" not in err


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_through_the_cli(tmp_path, cli, case):
    name, content, fragments = CASES[case]
    path = _make(tmp_path, name, content)
    code, out, err = cli("trace", "inspect", str(path))
    _assert_one_line(code, err, path, fragments)
    assert out == ""


def test_missing_path_and_directory(tmp_path, cli):
    missing = tmp_path / "nope.csv"
    _assert_one_line(*cli("trace", "inspect", str(missing))[::2], missing, ["no such file"])
    _assert_one_line(*cli("trace", "inspect", str(tmp_path))[::2], tmp_path, ["holds no trace parts"])


def test_parquet_errors(tmp_path, cli):
    path = tmp_path / "t.parquet"
    frame = pd.DataFrame(
        {"arrival_s": [0.0, 1.0], "prompt_tokens": [3, 0], "output_tokens": [1, 1]}
    )
    frame.to_parquet(path, index=False)
    code, _, err = cli("trace", "inspect", str(path))
    _assert_one_line(code, err, path, ["row 2", "field 'prompt_tokens'", "at least 1"])
    frame.drop(columns="output_tokens").to_parquet(path, index=False)
    code, _, err = cli("trace", "inspect", str(path))
    _assert_one_line(code, err, path, ["missing column 'output_tokens'"])
    path.write_bytes(b"PAR1 this is not really parquet")
    code, _, err = cli("trace", "inspect", str(path))
    _assert_one_line(code, err, path, ["not a readable Parquet file"])


def test_trace_error_carries_path_row_and_field(tmp_path):
    path = _make(tmp_path, "a.csv", AZURE_2023.replace(",109\n", ",0\n"))
    with pytest.raises(TraceError) as info:
        load_trace(path)
    assert (info.value.path, info.value.row, info.value.field) == (str(path), 2, "GeneratedTokens")


def test_installed_command_prints_no_traceback(tmp_path):
    script = Path(sys.executable).with_name("balanceroute")
    if not script.exists():
        pytest.skip(f"{script} is not installed (pip install -e .)")
    path = _make(tmp_path, "bad.csv", AZURE_HEADER + "2023-11-16 18:15:47.0,twelve,3\n")
    done = subprocess.run(
        [str(script), "trace", "inspect", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines() == [
        f"balanceroute trace: error: {path}, row 1, field 'ContextTokens': "
        "expected a whole number of tokens, got 'twelve'"
    ]

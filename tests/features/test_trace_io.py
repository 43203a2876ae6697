"""Writing traces: every format reads back identical, and a failed write leaves nothing behind."""

from __future__ import annotations

import pandas as pd
import pytest

from balanceroute.features import trace_io
from balanceroute.features.errors import UserError
from balanceroute.features.loaders import load_trace
from balanceroute.features.schema import validate_trace
from balanceroute.features.synthetic import generate
from balanceroute.features.trace_io import write_trace


def _awkward() -> pd.DataFrame:
    """Keys that naive readers mangle: missing, 'NA', 'null', numbers, commas, quotes."""
    return generate("paper-prod", 50, seed=1).assign(
        prompt_key=[None, "NA", "null", "007", 'a,"b"', *[f"k{i % 3}" for i in range(45)]],
        arrival_s=lambda f: f["arrival_s"] + 1e-9,
    )


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
@pytest.mark.parametrize("preset", ["mooncake-conv", "geometric"])
def test_round_trip(tmp_path, suffix, preset):
    frame = generate(preset, 500, seed=2)
    path = write_trace(frame, tmp_path / f"trace{suffix}")
    pd.testing.assert_frame_equal(load_trace(path), frame, check_exact=True)


@pytest.mark.parametrize("suffix", [".csv", ".parquet", ".jsonl"])
def test_round_trip_keeps_awkward_keys_and_exact_floats(tmp_path, suffix):
    frame = _awkward()
    path = write_trace(frame, tmp_path / f"trace{suffix}")
    loaded = load_trace(path)
    pd.testing.assert_frame_equal(loaded, validate_trace(frame), check_exact=True)
    assert loaded["prompt_key"].iloc[1:5].tolist() == ["NA", "null", "007", 'a,"b"']
    assert pd.isna(loaded["prompt_key"].iloc[0])


def test_unknown_extension_lists_the_supported_ones(tmp_path):
    with pytest.raises(UserError, match=r"unknown extension '\.xlsx'; supported: \.csv, \.parquet"):
        write_trace(generate("geometric", 5), tmp_path / "t.xlsx")
    assert list(tmp_path.iterdir()) == []


def test_creates_missing_folders(tmp_path):
    path = write_trace(generate("geometric", 5), tmp_path / "a" / "b" / "t.csv")
    assert path.is_file()


def test_failed_write_leaves_no_partial_file(tmp_path, monkeypatch):
    def explode(frame, fh):
        fh.write(b"arrival_s,prompt_tokens\n0.0,")
        raise OSError("disk full")

    monkeypatch.setitem(trace_io.WRITERS, ".csv", explode)
    with pytest.raises(UserError, match=r"t\.csv.*disk full"):  # one line naming the file
        write_trace(generate("geometric", 5), tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []


def test_failed_write_keeps_the_previous_file(tmp_path, monkeypatch):
    path = write_trace(generate("geometric", 5), tmp_path / "t.jsonl")
    before = path.read_bytes()

    def explode(frame, fh):
        fh.write(b'{"arrival_s": 0')
        raise KeyboardInterrupt

    monkeypatch.setitem(trace_io.WRITERS, ".jsonl", explode)
    with pytest.raises(KeyboardInterrupt):
        write_trace(generate("geometric", 9), path)
    assert path.read_bytes() == before
    assert [p.name for p in tmp_path.iterdir()] == ["t.jsonl"]


def test_invalid_frame_is_refused_before_writing(tmp_path):
    bad = generate("geometric", 5).assign(output_tokens=0)
    with pytest.raises(UserError, match="output_tokens"):
        write_trace(bad, tmp_path / "t.csv")
    assert list(tmp_path.iterdir()) == []

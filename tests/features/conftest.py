"""Shared fixtures of the features tests: small trace files, the shared data folder, the CLI."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from balanceroute.cli import main as balanceroute_main
from tests.shared_data import shared_data_dir

SHARED_DATA = shared_data_dir()


@pytest.fixture
def write(tmp_path: Path) -> Callable[[str, str | bytes], Path]:
    """Write text or bytes to a file under tmp_path and return its path."""

    def _write(name: str, content: str | bytes) -> Path:
        path = tmp_path / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content, encoding="utf-8")
        return path

    return _write


@pytest.fixture
def shared_data() -> Path:
    """The shared public traces folder (../shared/data from the repository root)."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"shared traces not found at {SHARED_DATA} (they live beside the repository)")
    return SHARED_DATA


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., tuple[int, str, str]]:
    """Run ``balanceroute`` in-process; returns (exit code, stdout, stderr)."""

    def _run(*argv: str) -> tuple[int, str, str]:
        code = balanceroute_main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return _run

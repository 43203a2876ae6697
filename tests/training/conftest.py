"""Helpers for pipeline tests: run the CLI in-process against an isolated tracking store."""

from __future__ import annotations

import pytest

from balanceroute.cli import main as balanceroute_main

PRESET_ARGS = ["--preset", "azure-conv", "--requests", "900", "--seed", "1"]


def run_cli(args: list[str]) -> int:
    """``balanceroute_main(args)``, turning argparse exits into return codes."""
    try:
        return balanceroute_main(args)
    except SystemExit as exc:
        return int(exc.code or 0)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Work in tmp_path with the default (SQLite in the working folder) tracking store."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return tmp_path

"""The command line as a whole: one module per command, deprecated spellings, fast startup."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from balanceroute.cli import COMMANDS, build_parser, main

MINIMAL = {
    "trace": ["trace", "inspect", "t.csv"],
    "simulate": ["simulate", "--out", "o"],
    "ab": ["ab", "--arms", "count-jsq", "--out", "o"],
    "solve-step": ["solve-step", "--state", "s.json"],
    "train": ["train"],
    "pipeline": ["pipeline", "--log", "completions"],
    "evaluate": ["evaluate", "--estimator", "gbdt", "--out", "o"],
    "serve": ["serve"],
    "emulate": ["emulate"],
    "bench": ["bench", "--url", "http://127.0.0.1:9000", "--out", "o"],
    "gateway": ["gateway", "--rank", "http://127.0.0.1:9000", "--slots", "4"],
    "cost": ["cost", "fit", "--steps", "steps", "--out", "cost.json"],
    "real-group": [
        "real-group",
        "--engine",
        "http://127.0.0.1:8000",
        "--ranks",
        "2",
        "--slots",
        "8",
        "--step-log",
        "steps",
        "--out",
        "o",
    ],
}


def test_every_command_module_registers_its_command() -> None:
    assert set(MINIMAL) == set(COMMANDS)
    for argv in MINIMAL.values():
        parser = build_parser(argv)
        sub = next(a for a in parser._actions if a.dest == "command")
        assert set(sub.choices) == set(COMMANDS)
        assert callable(parser.parse_args(argv).func)


def test_deprecated_predictor_flag_still_works_and_says_so(tmp_path: Path, capsys) -> None:
    out = tmp_path / "run"
    args = ["simulate", "--preset", "geometric", "--requests", "120", "--saturate"]
    args += ["--workers", "2", "--slots", "4", "--router", "brh", "--predictor", "none"]
    assert main([*args, "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "--predictor is deprecated" in err and "use --estimator" in err
    assert (out / "summary.json").exists()


def test_a_command_imports_only_what_it_needs(tmp_path: Path) -> None:
    """``trace synth`` does not pay for MLflow, LightGBM or the web server."""
    code = (
        "import sys\n"
        "from balanceroute.cli import main\n"
        f"assert main(['trace', 'synth', '--requests', '50', '--out', {str(tmp_path / 't.csv')!r}]) == 0\n"
        "print(sorted(m for m in ('mlflow', 'lightgbm', 'fastapi', 'uvicorn') if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path
    )
    assert done.stdout.strip().splitlines()[-1] == "[]"

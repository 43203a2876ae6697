"""The house rules that keep the code base layered, checked on every run.

- (the layers of ``pyproject.toml``'s import-linter contracts are checked by ``scripts/test.sh``)
- no module of the package imports a project module inside a function (to dodge a cycle):
  lazy imports of heavy third-party libraries are the only imports inside functions;
- every package folder is installed (listed in ``pyproject.toml``) under ``balanceroute.``;
- an installed copy claims no generic top-level names, and old saved models still load there.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = ("features", "predict", "router", "training", "serving", "cli")


def _modules() -> list[Path]:
    return [p for folder in FOLDERS for p in sorted((ROOT / folder).rglob("*.py"))]


def _project_imports_in_functions(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for sub in ast.walk(node):
            names = []
            if isinstance(sub, ast.ImportFrom) and sub.module:
                names = [sub.module]
            elif isinstance(sub, ast.Import):
                names = [a.name for a in sub.names]
            found += [
                f"{path.relative_to(ROOT)}:{sub.lineno} {n}"
                for n in names
                if n.split(".")[0] in ("balanceroute", *FOLDERS)
            ]
    return found


def test_no_project_import_inside_a_function() -> None:
    found = [hit for path in _modules() for hit in _project_imports_in_functions(path)]
    assert found == []


def test_every_package_folder_is_installed_under_the_namespace() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(config["packages"])
    folders = {
        "balanceroute." + str(init.parent.relative_to(ROOT)).replace("/", ".")
        for folder in FOLDERS
        for init in (ROOT / folder).rglob("__init__.py")
    }
    assert listed == folders
    mapped = config["package-dir"]
    assert all(mapped[f"balanceroute.{f}"] == f for f in FOLDERS)


def _run_outside_the_repository(code: str, tmp_path: Path) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter whose working folder is not the repository."""
    return subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, check=False
    )


@pytest.mark.parametrize("name", FOLDERS)
def test_no_generic_top_level_name_is_installed(name: str, tmp_path: Path) -> None:
    done = _run_outside_the_repository(f"import {name}", tmp_path)
    assert done.returncode != 0 and "ModuleNotFoundError" in done.stderr


def test_models_saved_by_release_0_1_0_load_where_the_old_names_do_not_exist(tmp_path) -> None:
    golden = ROOT / "tests" / "golden" / "models"
    code = (
        "import sys\n"
        "from balanceroute.predict.model_store import load_file\n"
        f"for kind in ('survival', 'exactmatch', 'gbdt'):\n"
        f"    est = load_file({str(golden)!r} + f'/{{kind}}.joblib')\n"
        "    assert est.name == kind, est.name\n"
        "assert 'predict' not in sys.modules and 'features' not in sys.modules\n"
        "print('ok')\n"
    )
    done = _run_outside_the_repository(code, tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "ok"

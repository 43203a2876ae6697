#!/usr/bin/env bash
# Creates .venv on first use and (re)installs the project when pyproject.toml changes.
# Sourced by demo.sh and test.sh; prints nothing when the environment is already current.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="$ROOT/.venv"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x "$VENV/bin/python" ]; then
    echo "bootstrap: creating $VENV with $($PY --version)" >&2
    "$PY" -m venv "$VENV"
fi
STAMP="$VENV/.balanceroute-installed"
WANT="$(sha256sum "$ROOT/pyproject.toml" | cut -d' ' -f1)"
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$WANT" ]; then
    echo "bootstrap: installing balanceroute and its dependencies into .venv (first run takes a few minutes)" >&2
    "$VENV/bin/python" -m pip install --quiet --upgrade pip >&2
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[dev]" >&2
    echo "$WANT" > "$STAMP"
fi
export PATH="$VENV/bin:$PATH"
export MLFLOW_DISABLE_TELEMETRY=true

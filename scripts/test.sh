#!/usr/bin/env bash
# Runs the whole test suite in the project's own virtual environment (bootstrapped on first use).
# Extra arguments go to pytest, e.g. scripts/test.sh -k simulator -x
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
ruff check --quiet .
out="$(lint-imports --no-cache --no-logo 2>&1)" || { echo "$out" >&2; exit 1; }
exec python -m pytest -q "$@"

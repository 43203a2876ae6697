#!/usr/bin/env bash
# Runs the whole test suite in the project's own virtual environment (bootstrapped on first use).
# Extra arguments go to pytest, e.g. scripts/test.sh -k simulator -x
# Two pytest workers by default, a test file each (TEST_WORKERS=0 runs in one process): most live
# tests wait on servers and sockets, so two halve the suite's time on a 2-core machine.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$ROOT/scripts/bootstrap.sh"
cd "$ROOT"
# tests/ops checks the shipped Prometheus rules with promtool (Debian's prometheus package):
# install it where apt-get can (as root, as in CI); elsewhere those tests skip and say why.
if ! command -v promtool >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
    echo "test.sh: installing Debian's prometheus package for promtool (tests/ops)" >&2
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1; then
        echo "test.sh: could not install prometheus; the promtool tests will skip" >&2
    fi
fi
ruff check --quiet .
out="$(lint-imports --no-cache --no-logo 2>&1)" || { echo "$out" >&2; exit 1; }
exec python -m pytest -q -n "${TEST_WORKERS:-2}" --dist loadfile "$@"

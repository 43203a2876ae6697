"""``python -m balanceroute.serving``: the server alone, configured by ``BALANCEROUTE_*`` (what
``balanceroute serve`` execs into once it has checked its flags)."""

from __future__ import annotations

import os
import sys

from balanceroute.features.errors import UserError
from balanceroute.features.limits import input_limits

try:  # the request schemas are built from the limits: check the overrides before importing them
    input_limits()
except UserError as _exc:
    print(f"balanceroute serve: error: {_exc}", file=sys.stderr)
    sys.exit(_exc.exit_code)

from balanceroute.serving.service.server import load_serve_settings, run_server


def main() -> int:
    """Serve until stopped; a bad configuration is one line on stderr and exit code 2."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    try:
        settings = load_serve_settings()
    except UserError as exc:
        print(f"balanceroute serve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    run_server(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())

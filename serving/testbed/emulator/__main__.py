"""``python -m balanceroute.serving.testbed.emulator CONFIG_JSON``: the emulator alone (what
``balanceroute emulate`` execs into once it has checked its flags)."""

from __future__ import annotations

import json
import sys

from balanceroute.features.errors import UserError
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.runner import run_emulator


def main(argv: list[str] | None = None) -> int:
    """Serve until stopped; a bad configuration or a busy port is one line and exit code 2."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m balanceroute.serving.testbed.emulator CONFIG_JSON", file=sys.stderr)
        return 2
    try:
        run_emulator(EmulatorConfig.from_dict(json.loads(args[0])))
    except (UserError, ValueError, TypeError) as exc:
        print(f"balanceroute emulate: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

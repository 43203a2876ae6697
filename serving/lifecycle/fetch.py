"""``python -m balanceroute.serving.lifecycle.fetch URI OUT [--current VERSION]``: a registry model for the server.

Run by :mod:`.sources` in a child process so that MLflow never enters the server: resolves
``URI`` (``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``) to a version and prints one JSON
line describing it; unless that version is ``--current``, loads exactly that version with
``balanceroute.predict.model_store.load_estimator`` and writes the native estimator to ``OUT`` with joblib.
Errors go to stderr in one line, with exit code 2.
"""

from __future__ import annotations

import argparse
import os
import sys

from balanceroute.features.errors import UserError
from balanceroute.predict.model_store import load_estimator, save_estimator
from balanceroute.serving.lifecycle.sources import describe, resolve_registry


def main(argv: list[str] | None = None) -> int:
    """Resolve, load if changed, write; the parent reads the last stdout line."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    p = argparse.ArgumentParser(prog="python -m balanceroute.serving.lifecycle.fetch")
    p.add_argument("uri")
    p.add_argument("out")
    p.add_argument("--current", help="version already served: resolve only")
    args = p.parse_args(argv)
    try:
        resolved = resolve_registry(args.uri)
        if resolved.version == args.current:
            print(describe(resolved, changed=False))
            return 0
        estimator = load_estimator(f"models:/{resolved.name}/{resolved.version}")
        save_estimator(estimator, args.out)
    except UserError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    print(describe(resolved, changed=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())

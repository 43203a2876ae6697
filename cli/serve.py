"""``balanceroute serve``: the prediction and routing service under uvicorn.

The command checks its configuration, then replaces itself (``exec``, same pid) with a fresh
``python -m balanceroute.serving`` that imports only what serving needs, so nothing the command
line loaded to check the flags stays in the server for its whole life.
"""

from __future__ import annotations

import argparse
import os
import sys

from balanceroute.serving.lifecycle.sources import check_uri
from balanceroute.serving.service.server import load_serve_settings

FLAGS = ("model_uri", "model_uri_b", "host", "port", "log_level")


def cmd_serve(args: argparse.Namespace) -> int:
    """Check the configuration here (errors exit 2), then exec the lean server process."""
    flags = {k: getattr(args, k) for k in FLAGS}
    settings = load_serve_settings(flags)
    for uri in settings.uris().values():
        check_uri(uri)
    env = dict(os.environ)
    env.update({f"BALANCEROUTE_{k.upper()}": str(v) for k, v in flags.items() if v is not None})
    env.setdefault("OMP_NUM_THREADS", "1")
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "balanceroute.serving.service"], env)
    return 0  # pragma: no cover - exec does not return


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``serve`` subcommand."""
    p = sub.add_parser(
        "serve",
        help="serve predictions and routing decisions over HTTP",
        description="Serve POST /v1/predict, /v1/observe, /v1/route, GET /v1/models, /metrics, "
        "/healthz, /readyz and POST /v1/admin/reload. Every flag can also be set as "
        "BALANCEROUTE_<FLAG> (e.g. BALANCEROUTE_MODEL_URI); BALANCEROUTE_API_TOKEN requires a "
        "bearer token on every endpoint but the probes.",
    )
    p.add_argument(
        "--model-uri",
        help="model slot a: models:/NAME@ALIAS, models:/NAME/VERSION or a local .joblib file "
        "(required unless BALANCEROUTE_MODEL_URI is set)",
    )
    p.add_argument("--model-uri-b", help='optional model slot b, selected with "model": "b"')
    p.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, help="TCP port (default 8080)")
    p.add_argument("--log-level", help="log level (default info)")
    p.set_defaults(func=cmd_serve)

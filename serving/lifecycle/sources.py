"""Where a model comes from: an operator-configured URI, resolved to a version, then loaded.

Two forms, both chosen by the operator (flags or environment), never by a request, because the
artifacts are pickles and loading one runs code:

- ``models:/NAME@ALIAS`` or ``models:/NAME/VERSION``: the MLflow registry that
  ``MLFLOW_TRACKING_URI`` names. The alias is resolved to a version and that exact version is
  loaded, so what is served and what is reported agree; the version's run gives the training
  metrics and parameters. This runs in a child process (``python -m balanceroute.serving.lifecycle.fetch``)
  that hands the native estimator back as a joblib file: importing MLflow would weigh on the
  server for good, the child costs a few seconds per (re)load, off the request path.
- a local ``.joblib`` file (``save_estimator``): its version is a digest of the bytes,
  which are read once, hashed and unpickled from memory, so the two cannot disagree.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from balanceroute.features.errors import UserError
from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.model_store import error_line, load_file, setup_mlflow

_MODELS_URI = re.compile(r"^models:/(?P<name>[^/@]+)(?:@(?P<alias>[^/@]+)|/(?P<version>\d+))$")
FETCH_TIMEOUT_S = 600


@dataclass(frozen=True, slots=True)
class Resolved:
    """One concrete version of a configured URI, with what the registry says about it."""

    uri: str
    source: Literal["mlflow", "file"]
    name: str
    version: str
    aliases: tuple[str, ...] = ()
    run_id: str | None = None
    metrics: dict[str, float] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)


def check_uri(uri: str) -> str:
    """``uri`` if it has a supported form (a file must exist), else a UserError saying why."""
    if uri.startswith("models:/"):
        if not _MODELS_URI.match(uri):
            raise UserError(
                f"unsupported model URI '{uri}': use models:/NAME@ALIAS or models:/NAME/VERSION"
            )
        return uri
    if "://" in uri or uri.startswith("runs:/"):
        raise UserError(
            f"unsupported model URI '{uri}': use models:/NAME@ALIAS, models:/NAME/VERSION "
            "or a local .joblib path"
        )
    if not Path(uri).is_file():
        raise UserError(f"model file '{uri}' does not exist")
    return uri


def fetch(
    uri: str, current: str | None, force: bool
) -> tuple[Resolved, CompletionEstimator] | None:
    """The version ``uri`` names now and its estimator; None if it is ``current`` (no ``force``)."""
    check_uri(uri)
    if uri.startswith("models:/"):
        return _fetch_registry(uri, None if force else current)
    path = Path(uri)
    payload = path.read_bytes()
    digest = hashlib.sha256(payload).hexdigest()[:12]
    if digest == current and not force:
        return None
    resolved = Resolved(uri=uri, source="file", name=path.stem, version=digest)
    return resolved, load_file(payload, name=uri)


def _fetch_registry(uri: str, current: str | None) -> tuple[Resolved, CompletionEstimator] | None:
    with tempfile.TemporaryDirectory(prefix="balanceroute-fetch-") as tmp:
        out = Path(tmp) / "estimator.joblib"
        args = [sys.executable, "-m", "balanceroute.serving.lifecycle.fetch", uri, str(out)]
        if current is not None:
            args += ["--current", current]
        try:
            done = subprocess.run(
                args, capture_output=True, text=True, timeout=FETCH_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired:
            raise UserError(f"resolving {uri} took more than {FETCH_TIMEOUT_S} s") from None
        if done.returncode != 0:
            lines = [ln for ln in done.stderr.strip().splitlines() if error_line(ln) == ln.strip()]
            raise UserError(f"cannot load {uri}: {(lines or [f'exit code {done.returncode}'])[-1]}")
        meta = json.loads(done.stdout.strip().splitlines()[-1])
        if not meta.pop("changed"):
            return None
        meta["aliases"] = tuple(meta["aliases"])
        return Resolved(**meta), load_file(out, name=uri)


def resolve_registry(uri: str) -> Resolved:
    """Look a ``models:/`` URI up in the MLflow registry (imports MLflow: call it in a child)."""
    from mlflow.exceptions import MlflowException
    from mlflow.tracking import MlflowClient

    setup_mlflow()
    m = _MODELS_URI.match(uri)
    if m is None:
        raise UserError(f"unsupported model URI '{uri}'")
    name = m["name"]
    client = MlflowClient()
    try:
        if m["alias"]:
            mv = client.get_model_version_by_alias(name, m["alias"])
        else:
            mv = client.get_model_version(name, m["version"])
    except MlflowException as exc:
        raise UserError(f"cannot resolve {uri}: {exc.message}") from None
    metrics: dict[str, float] = {}
    params: dict[str, Any] = {}
    if mv.run_id:
        try:
            run = client.get_run(mv.run_id)
            kind = (mv.tags or {}).get("kind")
            metrics = {k: float(v) for k, v in _of_kind(run.data.metrics, kind).items()}
            params = _of_kind(run.data.params, kind)
        except MlflowException:
            pass
    return Resolved(
        uri=uri,
        source="mlflow",
        name=name,
        version=str(mv.version),
        aliases=tuple(sorted(getattr(mv, "aliases", None) or ())),
        run_id=mv.run_id,
        metrics=metrics,
        params=params,
    )


def _of_kind(values: dict[str, Any], kind: str | None) -> dict[str, Any]:
    """A run that trained several kinds logs ``<kind>.<name>``: keep this version's kind."""
    prefix = f"{kind}."
    mine = {k[len(prefix) :]: v for k, v in values.items() if kind and k.startswith(prefix)}
    return mine or dict(values)


def describe(resolved: Resolved, changed: bool) -> str:
    """The JSON line ``serving.lifecycle.fetch`` prints for the parent."""
    return json.dumps({**asdict(resolved), "changed": changed})

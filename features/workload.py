"""The one way every command gets its requests: a trace file, or else a synthetic preset.

The returned description (kind, path or preset, rows, SHA-256) goes into the resolved
configuration written next to every result, so a run can be traced back to its exact input.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from balanceroute.features.digest import frame_sha256, path_sha256
from balanceroute.features.errors import UserError
from balanceroute.features.loaders import AUTO, detect_format, load_trace, trace_parts
from balanceroute.features.synthetic import Preset, generate, get_preset

DEFAULT_PRESET = "paper-prod"
DEFAULT_REQUESTS = 10_000


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    """Where a command's requests come from: a trace file, else a synthetic preset."""

    trace: str | None = field(
        default=None, metadata={"help": "trace file (Azure, Mooncake, BurstGPT or canonical)"}
    )
    preset: str | None = field(
        default=None, metadata={"help": f"synthetic preset when no trace ({DEFAULT_PRESET})"}
    )
    requests: int | None = field(
        default=None, metadata={"help": "use the first N requests of the trace (synthetic: N)"}
    )
    seed: int = field(default=0, metadata={"help": "seed of the preset and of any sampling"})
    format: str = field(default=AUTO, metadata={"help": "trace layout (default: detected)"})
    key_blocks: int = field(
        default=2, metadata={"help": "Mooncake: leading hash blocks that form the prompt key"}
    )


def load_workload(spec: WorkloadSpec) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Requests from ``spec.trace`` (its first ``requests`` rows if given), else from its preset
    (default ``paper-prod``, 10,000 requests), with a description of where they came from."""
    trace, preset, requests, seed = spec.trace, spec.preset, spec.requests, spec.seed
    format, key_blocks = spec.format, spec.key_blocks
    if trace is not None and preset is not None:
        raise UserError("give either a trace file or a synthetic preset, not both")
    if requests is not None and requests < 1:
        raise UserError(f"the number of requests must be at least 1, got {requests}")
    if trace is not None:
        name = detect_format(trace) if format == AUTO else format
        frame = load_trace(trace, format=name, key_blocks=key_blocks, limit=requests)
        source = {
            "kind": "trace",
            "path": str(Path(trace).resolve()),
            "format": name,
            "key_blocks": key_blocks,
            "limit": requests,
            "rows": len(frame),
            "sha256": path_sha256(trace, trace_parts(trace)),
        }
        return frame, source
    spec = get_preset(preset or DEFAULT_PRESET)
    frame = generate(spec, requests or DEFAULT_REQUESTS, seed=seed)
    source = {
        "kind": "synthetic",
        "preset": spec.name,
        "seed": seed,
        "rows": len(frame),
        "rate_rps": spec.arrivals.rate,
        "params": preset_params(spec),
        "sha256": frame_sha256(frame),
    }
    return frame, source


def preset_params(spec: Preset) -> dict[str, Any]:
    """A preset's fields as recorded with a run; ``drift`` only where the preset drifts (the
    record of a steady preset stays as it was before drifts existed)."""
    params = asdict(spec)
    if params.get("drift", 0) is None:
        del params["drift"]
    return params

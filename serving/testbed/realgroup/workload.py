"""The real group's workload: slices of a shared trace scaled to a small engine's context.

A CPU test group serves a few thousand tokens per request at most (``--max-model-len``) at a few
hundred tokens a second; the shared traces' prompts run to tens of thousands. Each request keeps
its place; its prompt and output lengths are scaled by one factor each for the whole trace (so
the trace's spread of KV loads and lifetimes survives) and capped so both fit the context. Every repeat of the A/B is its own
slice of consecutive requests, all arriving at once: the gateway's pool holds them and the router
admits them as slots free (the saturated regime the routers are built for), and each arm of a
repeat serves the same slice (the pairing).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from balanceroute.features.errors import UserError
from balanceroute.features.loaders import load_trace


@dataclass(frozen=True, slots=True)
class SliceSpec:
    """Which requests of which trace, and how they are scaled to the engine."""

    trace: str
    repeats: int = 5
    requests: int = 32  # per repeat
    prompt_scale: float = 0.25
    output_scale: float = 1.0
    max_model_len: int = 8192
    min_prompt: int = 16
    skip: int = 0  # requests of the trace left out before the first slice (e.g. training rows)

    def __post_init__(self) -> None:
        if self.repeats < 1 or self.requests < 1:
            raise UserError(f"repeats and requests must be >= 1, got {self.repeats}, "
                            f"{self.requests}")  # fmt: skip
        for name, value in (("prompt", self.prompt_scale), ("output", self.output_scale)):
            if not 0 < value <= 1:
                raise UserError(f"{name} scale must be in (0, 1], got {value}")


def scaled(frame: pd.DataFrame, spec: SliceSpec) -> pd.DataFrame:
    """The trace's requests with prompts scaled and both lengths capped to the context."""
    out = frame.copy()
    budget = spec.max_model_len - 1
    prompt = np.maximum(spec.min_prompt, np.round(out["prompt_tokens"] * spec.prompt_scale))
    prompt = np.minimum(prompt, budget // 2).astype(np.int64)
    output = np.round(out["output_tokens"].to_numpy() * spec.output_scale)
    output = np.clip(output, 1, budget - prompt).astype(np.int64)
    out["prompt_tokens"], out["output_tokens"] = prompt, output
    return out


def write_slices(spec: SliceSpec, folder: Path) -> list[Path]:
    """One canonical CSV per repeat (arrivals all at 0), and the rows before them for training."""
    frame = load_trace(spec.trace)
    need = spec.skip + spec.repeats * spec.requests
    if len(frame) < need:
        raise UserError(f"{spec.trace}: {len(frame)} requests, {need} needed "
                        f"({spec.repeats} repeats of {spec.requests} after {spec.skip})")  # fmt: skip
    frame = scaled(frame, spec)
    folder.mkdir(parents=True, exist_ok=True)
    columns = ["request_id", "arrival_s", "prompt_tokens", "output_tokens"]
    if "prompt_key" in frame.columns:
        columns.append("prompt_key")
    paths = []
    for r in range(spec.repeats):
        part = frame.iloc[spec.skip + r * spec.requests : spec.skip + (r + 1) * spec.requests]
        part = part.assign(arrival_s=0.0, request_id=[f"r{r}-{i}" for i in range(len(part))])
        path = folder / f"slice-{r}.csv"
        part[columns].to_csv(path, index=False)
        paths.append(path)
    if spec.skip:
        frame.iloc[: spec.skip][columns].to_csv(folder / "history.csv", index=False)
    return paths

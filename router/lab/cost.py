"""Iteration cost model: ``t_iter = t_fixed + t_comm + max_g (t_token * L_g + t_prefill * P_g)``.

``L_g`` is rank ``g``'s KV tokens and ``P_g`` the prompt tokens it computes in the step (a
prefill chunk stalls the whole group). With ``t_prefill = 0`` (every preset) prompts arrive
computed, from a separate prefill tier, and the step is ``t_fixed + t_comm + t_token * max_g L_g``.
With ``t_prefill > 0`` each rank computes its admitted prompts first come first served, at most
``prefill_chunk_tokens`` per step (vLLM's chunked prefill token budget), and a request's first
token comes at the end of the step that computes its last prompt token.

Presets
-------
``paper-dsv3`` (default) is calibrated to the paper's G=8 DeepSeek-V3 measurements (Table 3,
production trace): its engine step is about 60 ms, and Count-JSQ -> oracle BR-H cut mean
imbalance from 215,110 to 23,577 tokens (``max - mean`` from 26,889 to 2,947 tokens) while
throughput rose from 843 to 1,029 tok/s. With the same tokens per iteration, the step-time ratio
is 1,029 / 843 = 1.221, so 60 ms * 0.221 = 13.2 ms came from 23,942 extra tokens at the max:
``t_token = 0.55 us/token``. The paper's throughput at a 60 ms step implies about 62 running
requests (B about 8 per worker) holding about 30,000 tokens each worker; 60 ms minus
``0.55 us * 30,000 = 16.5 ms`` leaves ``t_fixed = 42 ms`` (weights, experts, all-to-all).
``unit`` (1 s per token, nothing fixed) makes hand-checked tests read directly in tokens.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.features.files import write_json

DEFAULT_PREFILL_CHUNK = 2048  # vLLM's max_num_batched_tokens on the CPU engine


@dataclass(frozen=True, slots=True)
class CostModel:
    """Affine time of one synchronized iteration, in seconds, with an optional prefill term."""

    t_fixed_s: float = 0.042
    t_token_s: float = 0.55e-6
    t_comm_s: float = 0.0
    t_prefill_s: float = 0.0
    prefill_chunk_tokens: int = DEFAULT_PREFILL_CHUNK

    def __post_init__(self) -> None:
        values = (self.t_fixed_s, self.t_token_s, self.t_comm_s, self.t_prefill_s)
        if not all(math.isfinite(v) and 0 <= v <= 3600 for v in values):
            raise UserError(
                f"step times must be finite, between 0 and 3600 s, got t_fixed {self.t_fixed_s}, "
                f"t_token {self.t_token_s}, t_comm {self.t_comm_s}, t_prefill {self.t_prefill_s}"
            )
        if sum(values[:3]) <= 0:
            raise UserError("an iteration must take some time: t_fixed + t_token + t_comm > 0")
        chunk = self.prefill_chunk_tokens
        if isinstance(chunk, bool) or not isinstance(chunk, int | np.integer) or chunk < 1:
            raise UserError(f"prefill chunk must be a whole number of tokens >= 1, got {chunk!r}")

    @property
    def prefills(self) -> bool:
        """True when the group computes prompts itself (``t_prefill > 0``)."""
        return self.t_prefill_s > 0

    def iteration_time(self, max_load: float | np.ndarray) -> float | np.ndarray:
        """Duration of a decode-only step whose busiest rank holds ``max_load`` KV tokens."""
        return self.t_fixed_s + self.t_comm_s + self.t_token_s * max_load

    def step_time(self, loads: np.ndarray, prefill: np.ndarray) -> np.ndarray:
        """Duration of steps from per-rank KV tokens and prompt tokens (``(..., G)`` arrays)."""
        work = self.t_token_s * np.asarray(loads, dtype=np.float64)
        work = work + self.t_prefill_s * np.asarray(prefill, dtype=np.float64)
        return self.t_fixed_s + self.t_comm_s + work.max(axis=-1)

    def as_dict(self) -> dict[str, float]:
        """The parameters; the prefill ones only when the prefill term is on (records written
        before it existed stay as they were)."""
        out = asdict(self)
        if not self.prefills:
            del out["t_prefill_s"], out["prefill_chunk_tokens"]
        return out


COST_PRESETS: dict[str, CostModel] = {
    "paper-dsv3": CostModel(t_fixed_s=0.042, t_token_s=0.55e-6, t_comm_s=0.0),
    "unit": CostModel(t_fixed_s=0.0, t_token_s=1.0, t_comm_s=0.0),
}


def cost_preset(name: str) -> CostModel:
    """The preset called ``name``."""
    try:
        return COST_PRESETS[name]
    except KeyError:
        raise UserError(
            f"unknown cost preset '{name}'; known presets: {', '.join(COST_PRESETS)}"
        ) from None


FILE_KEYS = ("t_fixed_s", "t_token_s", "t_prefill_s", "t_comm_s", "prefill_chunk_tokens")


def write_cost_file(path: str | Path, cost: CostModel, fit: dict[str, Any] | None = None) -> Path:
    """Write ``cost`` (every parameter) and how it was fitted as a cost file (JSON)."""
    payload: dict[str, Any] = {key: getattr(cost, key) for key in FILE_KEYS}
    if fit is not None:
        payload["fit"] = fit
    return write_json(path, payload)


def read_cost_file(path: str | Path) -> CostModel:
    """The cost model in a cost file; a file that is not one is a UserError naming the fault."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise UserError(f"cost file {path}: cannot read it: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise UserError(f"cost file {path}: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise UserError(f"cost file {path}: expected a JSON object, got {type(data).__name__}")
    missing = [k for k in FILE_KEYS if k not in data]
    unknown = sorted(set(data) - set(FILE_KEYS) - {"fit"})
    if missing or unknown:
        faults = [f"{what} keys {', '.join(keys)}" for what, keys in (("missing", missing),
                  ("unknown", unknown)) if keys]  # fmt: skip
        raise UserError(f"cost file {path}: {'; '.join(faults)} (expected {', '.join(FILE_KEYS)})")
    for key in FILE_KEYS:
        value = data[key]
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise UserError(f"cost file {path}: {key} must be a number, got {value!r}")
        if not (math.isfinite(value) and value >= 0):
            raise UserError(f"cost file {path}: {key} must be finite and >= 0, got {value}")
    if data["prefill_chunk_tokens"] != int(data["prefill_chunk_tokens"]):
        raise UserError(f"cost file {path}: prefill_chunk_tokens must be a whole number")
    params = {key: float(data[key]) for key in FILE_KEYS}
    params["prefill_chunk_tokens"] = int(data["prefill_chunk_tokens"])
    try:
        return CostModel(**params)
    except UserError as exc:
        raise UserError(f"cost file {path}: {exc}") from None


def resolve_cost(name: str) -> CostModel:
    """A preset by name, else a cost file by path: what ``--cost`` accepts."""
    if name in COST_PRESETS:
        return COST_PRESETS[name]
    if Path(name).is_file():
        return read_cost_file(name)
    raise UserError(
        f"--cost '{name}' is neither a preset ({', '.join(COST_PRESETS)}) nor a readable cost "
        "file (balanceroute cost fit writes one)"
    )

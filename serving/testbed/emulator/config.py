"""Configuration of the engine emulator: one synchronized decode group behind G ports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from balanceroute.features.errors import UserError
from balanceroute.router.lab.cost import CostModel, cost_preset

OUTPUT_KINDS = ("geometric", "lognormal", "max")
# ``GET /get_load``: SGLang's list (what sglang-router reads) or ``{"load": n}`` (vllm-router).
GET_LOAD_SHAPES = ("sglang", "load")
DEFAULT_MODEL = "balanceroute-emulator"
# --time-scale bounds: slower than 1,000x real time is no emulation of a serving engine, and
# faster than 10,000x steps shorter than the event loop can keep (1e-300 was accepted).
MIN_TIME_SCALE, MAX_TIME_SCALE = 1e-3, 1e4
MAX_SLOTS, MAX_RANKS = 65_536, 4096  # beyond any engine: a typo, not a group (arrays G x B)


@dataclass(frozen=True, slots=True)
class OutputLengths:
    """Output length of a request that may stop early (``ignore_eos`` false), capped by
    ``max_tokens``: ``geometric`` with mean ``mean``, ``lognormal`` with median ``mean`` and log
    spread ``sigma``, or ``max`` (always ``max_tokens``)."""

    kind: str = "geometric"
    mean: float = 256.0
    sigma: float = 1.0

    def __post_init__(self) -> None:
        if self.kind not in OUTPUT_KINDS:
            raise UserError(
                f"unknown output distribution '{self.kind}'; known: {', '.join(OUTPUT_KINDS)}"
            )
        if not self.mean >= 1:
            raise UserError(f"output mean must be >= 1 token, got {self.mean}")
        if not self.sigma >= 0:
            raise UserError(f"output sigma must be >= 0, got {self.sigma}")

    def draw(self, rng: np.random.Generator, cap: int) -> int:
        """One output length in ``1..cap``."""
        if self.kind == "max":
            return cap
        if self.kind == "geometric":
            value = int(rng.geometric(1.0 / self.mean))
        else:
            value = round(self.mean * float(np.exp(self.sigma * rng.standard_normal())))
        return max(1, min(cap, value))


@dataclass(frozen=True, slots=True)
class EmulatorConfig:
    """One decode group: ``ranks`` x ``slots``, the cost model, time scale and serving options."""

    ranks: int = 8
    slots: int = 32
    cost_name: str = "paper-dsv3"
    cost: CostModel = field(default_factory=lambda: cost_preset("paper-dsv3"))
    time_scale: float = 1.0
    seed: int = 0
    host: str = "127.0.0.1"
    port_base: int = 9000
    model: str = DEFAULT_MODEL
    max_model_len: int = 131_072
    kv_capacity_tokens: int = 0  # per rank, for vllm:kv_cache_usage_perc; 0 = slots * 16384
    output: OutputLengths = field(default_factory=OutputLengths)
    log_dir: str | None = None
    rank_header: str | None = None  # a request carrying it runs on the rank it names
    resync_s: float = 1.0  # a group this late against its deadlines re-anchors its clock
    get_load: str = "sglang"  # the shape of GET /get_load, one of GET_LOAD_SHAPES

    def __post_init__(self) -> None:
        checks = [
            (1 <= self.slots <= MAX_SLOTS,
             f"--slots must be within [1, {MAX_SLOTS}] (a rank's running requests), "
             f"got {self.slots}"),
            (1 <= self.ranks <= MAX_RANKS, f"--ranks must be within [1, {MAX_RANKS}], got {self.ranks}"),
            (bool(self.model.strip()), "--model must name the served model, got an empty name"),
            (MIN_TIME_SCALE <= self.time_scale <= MAX_TIME_SCALE,
             f"--time-scale must be within [{MIN_TIME_SCALE:g}, {MAX_TIME_SCALE:g}], "
             f"got {self.time_scale}"),
            (0 < self.port_base and self.port_base + self.ranks - 1 <= 65535,
             f"ports {self.port_base}..{self.port_base + self.ranks - 1} are not all valid"),
            (self.max_model_len >= 2, f"--max-model-len must be >= 2, got {self.max_model_len}"),
            (self.kv_capacity_tokens >= 0, "--kv-capacity must be >= 0"),
            (self.resync_s > 0, "resync_s must be > 0"),
            (self.get_load in GET_LOAD_SHAPES,
             f"--get-load must be one of {', '.join(GET_LOAD_SHAPES)}, got {self.get_load!r}"),
        ]  # fmt: skip
        for ok, message in checks:
            if not ok:
                raise UserError(message)

    @property
    def kv_capacity(self) -> int:
        """KV tokens one rank holds at 100% ``vllm:kv_cache_usage_perc``."""
        return self.kv_capacity_tokens or self.slots * 16_384

    def ports(self) -> list[int]:
        """One port per rank: ``port_base + g``."""
        return [self.port_base + g for g in range(self.ranks)]

    def urls(self) -> list[str]:
        """Base URL of every rank."""
        return [f"http://{self.host}:{p}" for p in self.ports()]

    def as_dict(self) -> dict[str, Any]:
        """Resolved configuration, written next to the logs."""
        out = asdict(self)
        out["kv_capacity"] = self.kv_capacity
        out["urls"] = self.urls()
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> EmulatorConfig:
        """The configuration :meth:`as_dict` wrote (derived keys are ignored)."""
        names = {f for f in cls.__dataclass_fields__}
        given = {k: v for k, v in data.items() if k in names}
        given["cost"] = CostModel(**given.get("cost", asdict(cost_preset("paper-dsv3"))))
        given["output"] = OutputLengths(**given.get("output", {}))
        return cls(**given)

"""Iteration cost model: ``t_iter = t_fixed + t_token * max_g L_g + t_comm``.

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

import math
from dataclasses import asdict, dataclass

import numpy as np

from balanceroute.features.errors import UserError


@dataclass(frozen=True, slots=True)
class CostModel:
    """Affine time of one synchronized decode iteration, in seconds."""

    t_fixed_s: float = 0.042
    t_token_s: float = 0.55e-6
    t_comm_s: float = 0.0

    def __post_init__(self) -> None:
        values = (self.t_fixed_s, self.t_token_s, self.t_comm_s)
        if not all(math.isfinite(v) and 0 <= v <= 3600 for v in values):
            raise UserError(
                f"step times must be finite, between 0 and 3600 s, got t_fixed {self.t_fixed_s}, "
                f"t_token {self.t_token_s}, t_comm {self.t_comm_s}"
            )
        if sum(values) <= 0:
            raise UserError("an iteration must take some time: t_fixed + t_token + t_comm > 0")

    def iteration_time(self, max_load: float | np.ndarray) -> float | np.ndarray:
        return self.t_fixed_s + self.t_comm_s + self.t_token_s * max_load

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


COST_PRESETS: dict[str, CostModel] = {
    "paper-dsv3": CostModel(t_fixed_s=0.042, t_token_s=0.55e-6, t_comm_s=0.0),
    "unit": CostModel(t_fixed_s=0.0, t_token_s=1.0, t_comm_s=0.0),
}


def cost_preset(name: str) -> CostModel:
    try:
        return COST_PRESETS[name]
    except KeyError:
        raise UserError(
            f"unknown cost preset '{name}'; known presets: {', '.join(COST_PRESETS)}"
        ) from None

"""Small builders shared by the router tests."""

from __future__ import annotations

import numpy as np
import pandas as pd

from balanceroute.features.schema import to_arrays, validate_trace
from balanceroute.router.lab.prefill import PrefillConfig, ReleasedRequests, release


def frame(prompts, outputs, arrivals=None, keys=None) -> pd.DataFrame:
    n = len(prompts)
    data = {
        "arrival_s": np.zeros(n) if arrivals is None else np.asarray(arrivals, dtype=float),
        "prompt_tokens": prompts,
        "output_tokens": outputs,
    }
    if keys is not None:
        data["prompt_key"] = keys
    return validate_trace(pd.DataFrame(data))


def released(prompts, outputs, arrivals=None, saturate=True, **prefill) -> ReleasedRequests:
    return release(
        to_arrays(frame(prompts, outputs, arrivals)), PrefillConfig(saturate=saturate, **prefill)
    )


def occupancy(result) -> np.ndarray:
    """Running requests per (iteration, worker), rebuilt from per-request records."""
    k, g = result.iterations, result.config.workers
    delta = np.zeros((k + 1, g), dtype=np.int64)
    np.add.at(delta, (result.admit_iter, result.worker), 1)
    ends = np.minimum(result.admit_iter + result.output_tokens, k)
    np.add.at(delta, (ends, result.worker), -1)
    return np.cumsum(delta, axis=0)[:k]

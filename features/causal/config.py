"""What the causal features are and how a trace's requests are timed: :class:`CausalConfig`.

Timing model for a trace: request ``i`` starts decoding at ``start_i = arrival_i + prompt_i /
prefill_tokens_per_s`` and finishes at ``start_i + output_i * assumed_tpot_s``; its snapshot at
age ``a`` happens at ``start_i + a * assumed_tpot_s``. "History" is the set of requests that
FINISHED strictly before the snapshot time, restricted to the most recent ``window`` of them
(what ``observe()`` keeps), so a future request's output can never leak into a past feature.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.schema import TraceArrays

GLOBAL_FEATURES: tuple[str, ...] = (
    "recent_out_mean",
    "recent_out_std",
    "recent_in_mean",
    "finish_rate",
)
KEY_STATS: tuple[str, ...] = ("count", "mean", "std", "last", "mean_minus_age", "last_minus_age")
COND_STATS: tuple[str, ...] = ("cond_alive", "cond_p", "cond_c")
EM_STATS: tuple[str, ...] = ("em_p", "em_c")
CONVERSATION_STATS: tuple[str, ...] = ("prev_prompt", "prompt_growth", "new_tokens")


@dataclass(frozen=True, slots=True)
class CausalConfig:
    """Parameters shared by the offline builder and the online state."""

    assumed_tpot_s: float = 0.06  # seconds per decode step (the paper's engine step)
    prefill_tokens_per_s: float = 10_000.0  # prefill estimate: prompt / rate seconds
    window: int = 131_072  # completions kept for rolling and per-key statistics
    key_windows: tuple[int, ...] = (4096, 512)  # shorter per-key windows, besides ``window``
    recent: int = 256  # completions in the rolling output/input statistics
    ewma_halflives: tuple[int, ...] = (16, 256)  # in completions
    rate_window_s: float = 60.0  # seconds for the completion-rate statistic
    key_sources: tuple[str, ...] = ("exact-length", "hash")
    horizon: int = DEFAULT_HORIZON  # H of the conditional finish features
    cond_windows: tuple[int, ...] = (1024,)  # shorter windows of the conditional features
    em_prior: float = 2.0  # pseudo-observations of the marginal in the shrunk key estimate
    feature_names: tuple[str, ...] = field(init=False)
    # conversation features: of the key's last finished request (the previous turn when the
    # key is a conversation's prefix), last so that configs pickled before it load
    conversation: bool = False

    def __post_init__(self) -> None:
        if not 1 <= self.recent <= self.window:
            raise ValueError("need 1 <= recent <= window")
        if any(not 1 <= w <= self.window for w in (*self.key_windows, *self.cond_windows)):
            raise ValueError("need 1 <= key window <= window")
        names = ["prompt_tokens", "age"]
        names += [f"ewma_out_{h}" for h in self.ewma_halflives]
        names += list(GLOBAL_FEATURES)
        names += [f"{src}_w{w}_{stat}" for src, w in self.key_tables for stat in KEY_STATS]
        names += [f"{src}_since_last_s" for src in self.key_sources]
        for w in self.cond_tables:
            names += [f"marginal_w{w}_{stat}" for stat in COND_STATS]
            names += [
                f"{src}_w{w}_{st}" for src in self.key_sources for st in COND_STATS + EM_STATS
            ]
        names += [f"{src}_{st}" for src in self.conversation_sources for st in CONVERSATION_STATS]
        object.__setattr__(self, "feature_names", tuple(names))

    @property
    def conversation_sources(self) -> tuple[str, ...]:
        """Key sources with conversation features: none unless ``conversation``; never the
        exact prompt length (its previous prompt is the prompt itself)."""
        if not self.conversation:
            return ()
        return tuple(src for src in self.key_sources if src != "exact-length")

    @property
    def recent_features(self) -> tuple[str, ...]:
        """Features of the latest few completions (EWMAs, the last ``recent`` outputs) or of the
        clock (completion rate, seconds since a key's last completion): they follow drift where
        snapshots and completions share the trace's timeline, and mislead where the completion
        stream is not a fair sample of outputs (a saturated replay finishes its shortest
        requests first). The shorter key and conditional windows are the config's to drop."""
        names = [f"ewma_out_{h}" for h in self.ewma_halflives]
        names += [*GLOBAL_FEATURES, *(f"{src}_since_last_s" for src in self.key_sources)]
        return tuple(names)

    @property
    def period_feature_names(self) -> tuple[str, ...]:
        """Names of the per-bin columns of the hazard model's person-period rows
        (:func:`balanceroute.features.causal.periods.bin_hazard_columns`, window by window)."""
        names = []
        for w in self.cond_tables:
            names.append(f"marginal_w{w}_bin_hazard")
            for src in self.key_sources:
                names += [f"{src}_w{w}_bin_hazard", f"{src}_w{w}_bin_alive"]
        return tuple(names)

    @property
    def cond_tables(self) -> tuple[int, ...]:
        """Windows of the conditional (stacked empirical) features, without repeats."""
        return tuple(dict.fromkeys((self.window, *self.cond_windows)))

    @property
    def key_tables(self) -> tuple[tuple[str, int], ...]:
        """(key source, window) of every per-key statistic table, without repeated windows."""
        wins = tuple(dict.fromkeys((self.window, *self.key_windows)))
        return tuple((src, w) for src in self.key_sources for w in wins)

    def decode_start(self, arrival_s: np.ndarray, prompt_tokens: np.ndarray) -> np.ndarray:
        """Estimated decode start times: arrival plus the prefill estimate."""
        prefill = 0.0 if self.prefill_tokens_per_s <= 0 else 1.0 / self.prefill_tokens_per_s
        return arrival_s + prompt_tokens * prefill

    def finish_times(self, trace: TraceArrays) -> np.ndarray:
        """Estimated finish time of every request of a trace."""
        start = self.decode_start(trace.arrival_s, trace.prompt_tokens)
        return start + trace.output_tokens * self.assumed_tpot_s

    def snapshot_times(self, trace: TraceArrays, index: np.ndarray, age: np.ndarray) -> np.ndarray:
        """Time at which request ``index`` has generated ``age`` tokens."""
        start = self.decode_start(trace.arrival_s[index], trace.prompt_tokens[index])
        return start + age * self.assumed_tpot_s


def _setstate(self: CausalConfig, state: list) -> None:
    """Unpickle a config, giving fields added since it was saved their defaults."""
    fields = dataclasses.fields(self)
    for f, value in zip(fields, state, strict=False):
        object.__setattr__(self, f.name, value)
    for f in fields[len(state) :]:
        object.__setattr__(self, f.name, f.default)


CausalConfig.__setstate__ = _setstate  # the dataclass's own would leave such fields unset

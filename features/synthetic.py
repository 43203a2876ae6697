"""Seeded synthetic workloads: the embedded default, so the project runs with no trace at hand.

A template preset draws a catalogue of prompt templates (Zipf popularity). Each template has
its own typical prompt and output lengths; a request of that template varies around them
(mean-one log-normal spread), and its ``prompt_key`` is the template id, so a key-based
estimator has real signal. A share of one-off prompts gets fresh lengths and a unique key. Template lengths are
drawn stratified along the popularity ranks (every block of ``STRATA`` neighbouring ranks covers
the whole distribution), so the few most popular templates cannot drag the means far from the
targets whatever the seed. Arrivals are bursty: a two-state Markov-modulated Poisson process
(:class:`Bursts`), optionally floored to batch ticks.

Statistics each preset produces (``generate(name, 50_000, seed=0)``, measured with
:func:`features.stats.trace_stats`; lengths as mean / std / median / p99 / max; the rate is the
realised mean; recurrence is the share of requests whose key occurs again, then the mean per-key
output std against the overall one):

- paper-prod: prompt 3,240 / 2,498 / 2,592 / 12,843 / 46,822; output 1,200 / 1,355 / 784 /
  6,682 / 16,384; 0.80 req/s; keys recur for 80%, output std 587 within a key vs 1,355.
- azure-conv: prompt 1,164 / 1,070 / 1,027 / 4,296 / 13,163; output 200 / 159 / 128 / 626 /
  1,000; 5.53 req/s; keys recur for 95%, output std 50 within a key vs 159.
- mooncake-conv: prompt 12,058 / 15,938 / 6,824 / 83,238 / 131,072; output 347 / 283 / 308 /
  1,386 / 2,000; 3.40 req/s in 3 s batches; keys recur for 58%, output std 117 vs 283.
- geometric: prompt 1,022 / 592 / 1,019 / 2,028 / 2,048; output 256 / 257 / 176 / 1,189 /
  2,923; 4.00 req/s (Poisson); no keys.
- code-completion: see ``tests/features/test_synthetic.py`` for the targets it is held to.
- azure-drift: azure-conv until half-way; then each template's outputs spread with log-sd 1.0
  instead of 0.25 (same templates, mean lengths and arrivals), so a model trained before the
  change is confidently wrong after it: the learning loop's drift demo
  (``benchmarks/perf/learning_loop.py``).

Targets: paper-prod mean prompt 3,197 (std about 2,500), mean output 1,185 (std about 1,400),
the paper's production trace; azure-conv the Azure 2023 conversation trace (prompt mean 1,155,
median 1,020, max 14,050; output mean 211, median 129, capped at 1,000; within-length output std
57 vs 163 overall; 5.5 req/s); mooncake-conv the Mooncake conversation trace (prompt mean
12,035, output mean 343, 57% of requests share their first two blocks; 3.4 req/s in 3-second
batches); code-completion short outputs next to ``H = 80`` (prompts of a few thousand tokens:
mean 3,000; outputs of a few dozen: mean 40, at most 512), the shape of IDE code completion;
geometric the paper's theorem regime (prompts uniform on 1..s, decode lengths
geometric with mean 1/p, no template signal).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.special import ndtri

from balanceroute.features.errors import UserError
from balanceroute.features.schema import validate_trace

STRATA = 16
MOONCAKE_BLOCK = 512


@dataclass(frozen=True, slots=True)
class LogNormal:
    """Log-normal law given by its median and log-space standard deviation."""

    median: float
    sigma: float

    @classmethod
    def from_moments(cls, mean: float, std: float, *, within: float = 0.0) -> LogNormal:
        """The law of template means that, with mean-one ``within`` log-sd spread around each,
        gives requests of overall ``mean`` and ``std``."""
        between = np.log1p((std / mean) ** 2) - within**2
        return cls(median=float(mean / np.exp(between / 2)), sigma=float(np.sqrt(between)))

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF at ``u`` in (0, 1)."""
        return self.median * np.exp(self.sigma * ndtri(u))


@dataclass(frozen=True, slots=True)
class Quantiles:
    """Law given by quantile knots, log-linear in between: shapes measured on real traces."""

    probs: tuple[float, ...]
    values: tuple[float, ...]

    def quantile(self, u: np.ndarray) -> np.ndarray:
        """Inverse CDF at ``u`` in [0, 1]."""
        return np.exp(np.interp(u, self.probs, np.log(self.values)))


KNOTS = (0.0, 0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999, 1.0)

# Quantiles at KNOTS measured on ../shared/data (row-weighted): prompt lengths, and the median
# output of each request's key (exact ContextTokens for Azure, first two hash blocks for Mooncake).
AZURE_PROMPT = Quantiles(KNOTS, (2, 29, 181, 207, 387, 403, 703, 1020, 1071, 1130, 1315, 2734, 4083, 4142, 6179, 14050))  # fmt: skip
AZURE_OUTPUT = Quantiles(KNOTS, (12, 14, 48, 56, 80, 95, 100, 134, 179, 397, 404, 411, 413, 423, 458, 649))  # fmt: skip
MOONCAKE_PROMPT = Quantiles(KNOTS, (891, 894, 901, 964, 1794, 3375, 5087, 6959, 9604, 13024, 17752, 27160, 39409, 83373, 121301, 126195))  # fmt: skip
MOONCAKE_OUTPUT = Quantiles(KNOTS, (1, 3, 12, 27, 124, 229, 299, 352, 398, 444, 492, 571, 667, 1076, 2000, 2000))  # fmt: skip


@dataclass(frozen=True, slots=True)
class Bursts:
    """Two-state Markov-modulated Poisson arrivals with long-run mean ``rate`` requests/s.

    Calm and burst periods alternate with exponential lengths (means ``calm_s``, ``burst_s``);
    the burst state runs ``burst_factor`` times faster. The defaults reproduce the burstiness of
    the Azure 2023 conversation trace (variance/mean of request counts about 5 over 10 s windows
    and 26 over 60 s; a Poisson process gives 1). The first request arrives at 0 and the
    time axis is scaled so the realised mean rate, ``(n - 1) / span``, is exactly ``rate``.
    ``tick_s > 0`` then floors arrival times to multiples of the tick (batched releases).
    """

    rate: float
    burst_factor: float = 1.8
    calm_s: float = 400.0
    burst_s: float = 200.0
    tick_s: float = 0.0

    def times(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """``n`` sorted arrival times in seconds."""
        calm_rate = self.rate * (self.calm_s + self.burst_s)
        calm_rate /= self.calm_s + self.burst_factor * self.burst_s
        per_cycle = self.rate * (self.calm_s + self.burst_s)
        cycles = int(np.ceil(1.5 * n / per_cycle)) + 8
        while True:
            means = np.tile([self.calm_s, self.burst_s], cycles)
            rates = np.tile([calm_rate, calm_rate * self.burst_factor], cycles)
            lengths = rng.exponential(means)
            counts = rng.poisson(rates * lengths)
            if counts.sum() >= n:
                break
            cycles *= 2
        starts = np.cumsum(lengths) - lengths
        total = int(counts.sum())
        times = np.repeat(starts, counts) + rng.random(total) * np.repeat(lengths, counts)
        times = np.sort(times)[:n]
        times -= times[0]
        if n > 1 and times[-1] > 0:
            times *= (n - 1) / (self.rate * times[-1])
        if self.tick_s > 0:
            times = np.floor(times / self.tick_s) * self.tick_s
        return times


@dataclass(frozen=True, slots=True)
class Lengths:
    """Prompt lengths, output lengths and prompt keys of ``n`` requests, in arrival order."""

    prompt: np.ndarray
    output: np.ndarray
    key: np.ndarray | None


def mean_one_noise(rng: np.random.Generator, sigma: float, n: int) -> np.ndarray:
    """Log-normal factors with log-sd ``sigma`` and mean 1, so spread leaves means unchanged."""
    return np.exp(sigma * rng.standard_normal(n) - sigma**2 / 2)


def zipf_weights(count: int, exponent: float) -> np.ndarray:
    """Popularity of ``count`` ranked items, proportional to ``rank ** -exponent``."""
    weights = np.arange(1, count + 1, dtype=np.float64) ** -exponent
    return weights / weights.sum()


def stratified_uniforms(rng: np.random.Generator, count: int) -> np.ndarray:
    """Uniforms where each block of ``STRATA`` consecutive items covers all strata once."""
    blocks = -(-count // STRATA)
    strata = rng.permuted(np.tile(np.arange(STRATA), (blocks, 1)), axis=1).ravel()[:count]
    return (strata + rng.random(count)) / STRATA


def mooncake_keys(group: np.ndarray, prompt: np.ndarray) -> np.ndarray:
    """Mooncake-style prefix keys ``0-<b>``: block 0 is shared, ``b`` numbers new blocks in order
    of first appearance, each request taking ``ceil(prompt / 512) - 1`` fresh block ids."""
    fresh = np.maximum(-(-prompt // MOONCAKE_BLOCK) - 1, 0)
    next_block = 1 + np.concatenate([[0], np.cumsum(fresh)[:-1]])
    _, first, inverse = np.unique(group, return_index=True, return_inverse=True)
    return np.char.add("0-", next_block[first][inverse].astype(str)).astype(object)


@dataclass(frozen=True, slots=True)
class Drift:
    """The output law changes part-way: from request ``int(at * n)`` on, outputs spread with
    log-sd ``output_spread`` (mean one) around their template's typical length, times
    ``output_scale``. Templates, prompts and arrivals do not change."""

    at: float
    output_spread: float
    output_scale: float = 1.0


@dataclass(frozen=True, slots=True)
class TemplatePreset:
    """A workload of recurring prompt templates plus one-off prompts (``drift``: a change of the
    output law part-way)."""

    name: str
    summary: str
    arrivals: Bursts
    templates: int
    popularity: float
    one_off_share: float
    prompt: LogNormal | Quantiles
    prompt_spread: float
    output: LogNormal | Quantiles
    output_spread: float
    max_prompt: int
    max_output: int
    key_style: str = "template"
    drift: Drift | None = None

    def lengths(self, catalogue: np.random.Generator, rows: np.random.Generator, n: int) -> Lengths:
        """Draw the template catalogue, then ``n`` requests from it."""
        base_prompt = self.prompt.quantile(stratified_uniforms(catalogue, self.templates))
        base_output = self.output.quantile(stratified_uniforms(catalogue, self.templates))
        template = rows.choice(
            self.templates, size=n, p=zipf_weights(self.templates, self.popularity)
        )
        one_off = rows.random(n) < self.one_off_share
        prompt_mid = base_prompt[template]
        output_mid = base_output[template]
        prompt_mid[one_off] = self.prompt.quantile(rows.random(int(one_off.sum())))
        output_mid[one_off] = self.output.quantile(rows.random(int(one_off.sum())))
        prompt = np.rint(prompt_mid * mean_one_noise(rows, self.prompt_spread, n))
        spread, scale = self.output_law(n)
        output = np.rint(output_mid * scale * mean_one_noise(rows, spread, n))
        prompt = np.clip(prompt, 1, self.max_prompt).astype(np.int64)
        output = np.clip(output, 1, self.max_output).astype(np.int64)
        group = np.where(one_off, self.templates + np.arange(n), template)
        if self.key_style == "mooncake":
            key = mooncake_keys(group, prompt)
        else:
            key = np.where(
                one_off,
                np.char.add("once-", np.arange(n).astype(str)),
                np.char.add("t", template.astype(str)),
            ).astype(object)
        return Lengths(prompt, output, key)

    def output_law(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Each request's output spread and scale: the preset's, or the drift's from its row on."""
        spread, scale = np.full(n, self.output_spread), np.ones(n)
        if self.drift is not None:
            after = np.arange(n) >= int(self.drift.at * n)
            spread[after], scale[after] = self.drift.output_spread, self.drift.output_scale
        return spread, scale


@dataclass(frozen=True, slots=True)
class GeometricPreset:
    """The theorem's regime: prompts i.i.d. uniform on ``1..max_prompt`` (the bound ``s``),
    decode lengths i.i.d. geometric with mean ``mean_output`` (``p = 1 / mean_output``)."""

    name: str
    summary: str
    arrivals: Bursts
    max_prompt: int = 2048
    mean_output: float = 256.0

    def lengths(self, catalogue: np.random.Generator, rows: np.random.Generator, n: int) -> Lengths:
        """``n`` independent requests; there are no templates and no keys."""
        prompt = rows.integers(1, self.max_prompt + 1, size=n)
        output = rows.geometric(1.0 / self.mean_output, size=n)
        return Lengths(prompt.astype(np.int64), output.astype(np.int64), None)


Preset = TemplatePreset | GeometricPreset

AZURE_CONV = TemplatePreset(
    name="azure-conv",
    summary="Azure 2023 conversation trace: exact prompt length per template, output <= 1000",
    arrivals=Bursts(rate=5.53),
    templates=2400,
    popularity=0.7,
    one_off_share=0.05,
    prompt=AZURE_PROMPT,
    prompt_spread=0.0,
    output=AZURE_OUTPUT,
    output_spread=0.25,
    max_prompt=14050,
    max_output=1000,
)

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in (
        TemplatePreset(
            name="paper-prod",
            summary="the paper's production trace: prompt mean 3,197, output mean 1,185, long tail",
            # Near saturation for the paper's G = 8 group (850-1,030 output tok/s at 1,185 each).
            arrivals=Bursts(rate=0.8),
            templates=2000,
            popularity=0.7,
            one_off_share=0.2,
            prompt=LogNormal.from_moments(3200, 2500, within=0.15),
            prompt_spread=0.15,
            output=LogNormal.from_moments(1185, 1400, within=0.5),
            output_spread=0.5,
            max_prompt=65536,
            max_output=16384,
        ),
        AZURE_CONV,
        TemplatePreset(
            name="mooncake-conv",
            summary="Mooncake conversation trace: long prompts, prefix-block keys, 3 s batches",
            arrivals=Bursts(rate=3.4, burst_factor=1.3, calm_s=120.0, burst_s=60.0, tick_s=3.0),
            templates=3000,
            popularity=0.5,
            one_off_share=0.42,
            prompt=MOONCAKE_PROMPT,
            prompt_spread=0.22,
            output=MOONCAKE_OUTPUT,
            output_spread=0.35,
            max_prompt=131072,
            max_output=2000,
            key_style="mooncake",
        ),
        TemplatePreset(
            name="code-completion",
            summary="code completion: prompts of a few thousand tokens, outputs of a few dozen",
            # About the decode capacity of G = 8, B = 64 under paper-dsv3: 512 slots freed every
            # 40 iterations of about 42 ms + 0.55 us * 64 * 3,000 tokens, i.e. 85 requests/s.
            arrivals=Bursts(rate=80.0),
            templates=5000,
            popularity=0.6,
            one_off_share=0.3,
            prompt=LogNormal.from_moments(3000, 1500, within=0.3),
            prompt_spread=0.3,
            output=LogNormal.from_moments(40, 40, within=0.5),
            output_spread=0.5,
            max_prompt=16384,
            max_output=512,
        ),
        dataclasses.replace(
            AZURE_CONV,
            name="azure-drift",
            summary="azure-conv whose outputs spread 4x wider within a template from the middle on",
            drift=Drift(at=0.5, output_spread=1.0),
        ),
        GeometricPreset(
            name="geometric",
            summary="theorem regime: uniform prompts on 1..2048, geometric outputs with mean 256",
            # About the paper-prod output token rate: 1,000 tok/s at 256 tokens a request.
            arrivals=Bursts(rate=4.0, burst_factor=1.0),
        ),
    )
}


def preset_names() -> list[str]:
    """Registered preset names, for help texts and error messages."""
    return list(PRESETS)


def get_preset(name: str) -> Preset:
    """The preset registered as ``name``; an unknown name is a UserError listing them."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UserError(f"unknown preset '{name}'; known presets: {', '.join(PRESETS)}") from None


def generate(preset: str | Preset, n_requests: int, seed: int = 0) -> pd.DataFrame:
    """A canonical, validated synthetic trace; the same preset, size and seed give the same
    frame. The catalogue, the requests and the arrivals use independent seeded streams."""
    spec = get_preset(preset) if isinstance(preset, str) else preset
    if n_requests < 1:
        raise UserError(f"the number of requests must be at least 1, got {n_requests}")
    catalogue, rows, clock = (
        np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
    )
    drawn = spec.lengths(catalogue, rows, n_requests)
    frame = pd.DataFrame(
        {
            "arrival_s": spec.arrivals.times(clock, n_requests),
            "prompt_tokens": drawn.prompt,
            "output_tokens": drawn.output,
            "prompt_key": drawn.key,
        }
    )
    return validate_trace(frame, source=f"preset '{spec.name}'")

"""``posterior``: each request's output law as its synthetic preset drew it. A study tool, not
deployable.

It answers "how much can any estimator get from what is knowable?": a template preset
(:mod:`balanceroute.features.synthetic`) draws a request's output as its template's output times
mean-one log-normal noise of log-sd ``output_spread`` (a one-off's as a fresh draw from the
marginal law, times the same noise). Knowing the catalogue exactly (regenerated from the preset
and its seed), this estimator answers with the Bayes-optimal survival curve of every request at
its age, ``P(O > a + h | O > a)``: the most any estimator can know at admission and while
running, short of the noise itself, which only the oracle knows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Self

import numpy as np
import pandas as pd
from scipy.special import log_ndtr

from balanceroute.features.errors import UserError
from balanceroute.features.synthetic import (
    LogNormal,
    TemplatePreset,
    get_preset,
    stratified_uniforms,
)
from balanceroute.predict.base import (
    CompletionEstimator,
    EstimatorParams,
    Fitting,
    Prediction,
    RunningBatch,
    from_survival,
)


@dataclass(frozen=True, slots=True)
class PosteriorParams(EstimatorParams):
    """The parameters of :class:`PosteriorEstimator`."""

    preset: str = field(default="paper-prod", metadata={"help": "the synthetic preset replayed"})
    trace_seed: int = field(default=0, metadata={"help": "the seed the trace was generated with"})


def template_laws(preset: TemplatePreset, trace_seed: int) -> tuple[np.ndarray, float, float]:
    """Log-space location of each template's output, the one-offs' location and their log-sd
    (the template spread and the noise together), regenerated from the preset's catalogue."""
    if not isinstance(preset.output, LogNormal):
        raise UserError(
            f"posterior: preset '{preset.name}' draws outputs from measured quantiles, not a "
            "log-normal law; only log-normal presets have a closed-form posterior"
        )
    catalogue = np.random.default_rng(np.random.SeedSequence(trace_seed).spawn(3)[0])
    stratified_uniforms(catalogue, preset.templates)  # the prompts come first in the stream
    base = preset.output.quantile(stratified_uniforms(catalogue, preset.templates))
    shift = -(preset.output_spread**2) / 2  # the noise is mean-one
    one_off_sd = float(np.hypot(preset.output.sigma, preset.output_spread))
    return np.log(base) + shift, float(np.log(preset.output.median) + shift), one_off_sd


class PosteriorEstimator(CompletionEstimator):
    """Survival curves of each request's true output law (its template's, or the marginal's)."""

    name = "posterior"
    Params = PosteriorParams
    fitting = Fitting.TRACE
    provides_survival = True
    projection = "expected"
    deployable = False
    learns_online = False

    def fit(self, history: pd.DataFrame) -> Self:
        preset = get_preset(self.preset)
        if not isinstance(preset, TemplatePreset) or preset.key_style != "template":
            raise UserError(f"posterior: preset '{self.preset}' has no template keys")
        loc, one_loc, one_sd = template_laws(preset, self.trace_seed)
        keys = history["prompt_key"].astype(str).to_numpy()
        template = np.full(keys.shape[0], -1, dtype=np.int64)
        named = np.char.startswith(keys.astype(np.str_), "t")
        template[named] = [int(k[1:]) for k in keys[named]]
        if template.max(initial=-1) >= preset.templates:
            raise UserError(
                f"posterior: key t{template.max()} is beyond preset '{self.preset}''s "
                f"{preset.templates} templates (was the trace made by another preset?)"
            )
        self.mu_ = np.where(template >= 0, loc[np.maximum(template, 0)], one_loc)
        self.sd_ = np.where(template >= 0, preset.output_spread, one_sd)
        self.fitted_ = True
        return self

    def log_survival(self, rows: np.ndarray, tokens: np.ndarray) -> np.ndarray:
        """``log P(O > tokens)`` for trace rows ``rows`` (outputs are rounded to integers)."""
        z = (np.log(tokens + 0.5) - self.mu_[rows, None]) / self.sd_[rows, None]
        return log_ndtr(-z)

    def predict(self, batch: RunningBatch, *, survival: bool = False) -> Prediction:
        self.check_fitted()
        if batch.request_index is None:
            raise ValueError("posterior needs request_index: the rows of the replayed trace")
        rows = np.asarray(batch.request_index, dtype=np.int64)
        ages = np.asarray(batch.age, dtype=np.float64)[:, None]
        tokens = ages + np.arange(self.horizon + 1, dtype=np.float64)[None, :]
        log_s = self.log_survival(rows, tokens)
        curves = np.exp(np.minimum(log_s - log_s[:, :1], 0.0))
        curves[:, 0] = 1.0
        pred = from_survival(curves)
        return pred if survival else Prediction(pred.p_finish, pred.c)

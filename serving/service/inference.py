"""One batched prediction: decoded columns in, the estimator's arrays out, as JSON bytes.

Floats are written by orjson straight from the float64 arrays (shortest round-trip form), so a
client decoding them with any correct JSON parser gets the in-process values bit for bit.
"""

from __future__ import annotations

import numpy as np
import orjson

from balanceroute.predict.base import Prediction, RunningBatch
from balanceroute.serving.service.decode import PredictInput, RunningColumns
from balanceroute.serving.service.models import LoadedModel


class HorizonUnavailable(ValueError):
    """The caller asked for a horizon the model cannot answer for."""


def running_batch(cols: RunningColumns, time_s: float | None) -> RunningBatch:
    """The estimator interface's view of decoded running requests."""
    return RunningBatch(
        prompt_tokens=cols.prompt_tokens, age=cols.age, prompt_key=cols.prompt_key, time_s=time_s
    )


def at_horizon(pred: Prediction, model_h: int, want_h: int) -> Prediction:
    """The prediction for a horizon ``want_h <= model_h``, read off the survival curves.

    ``P(r > h)`` does not depend on the horizon, so ``p_finish = 1 - S(H')`` and
    ``c = sum_{h<H'} S(h)`` are exact for the shorter horizon.
    """
    if want_h == model_h:
        return pred
    curves = pred.survival[:, : want_h + 1]
    return Prediction(
        p_finish=1.0 - curves[:, want_h], c=curves[:, :want_h].sum(axis=1), survival=curves
    )


def predict(model: LoadedModel, inp: PredictInput) -> tuple[Prediction, int]:
    """Run the model on a decoded body; returns the prediction and its horizon."""
    est = model.estimator
    model_h = est.horizon
    want_h = model_h if inp.horizon is None else inp.horizon
    if want_h > model_h or (want_h < model_h and not est.provides_survival):
        shorter = " or a shorter one" if est.provides_survival else ""
        raise HorizonUnavailable(
            f"model {model.slot} ({model.kind} version {model.version}) predicts {model_h} "
            f"iterations ahead: it answers for horizon {model_h}{shorter}, not {want_h}"
        )
    need_curves = inp.survival or want_h != model_h
    pred = est.predict(running_batch(inp.running, inp.time_s), survival=need_curves)
    if want_h != model_h and pred.survival is None:
        raise HorizonUnavailable(f"model {model.slot} returned no survival curves")
    pred = at_horizon(pred, model_h, want_h)
    if not inp.survival:
        pred = Prediction(pred.p_finish, pred.c, None)
    return pred, want_h


def encode(model: LoadedModel, inp: PredictInput, pred: Prediction, horizon: int) -> bytes:
    """The ``PredictResponse`` JSON, written from the arrays without per-row objects."""
    survival = None if pred.survival is None else np.ascontiguousarray(pred.survival, np.float64)
    body = {
        "model": model.ref().model_dump(),
        "horizon": horizon,
        "ids": inp.running.ids,
        "p_finish": np.ascontiguousarray(pred.p_finish, dtype=np.float64),
        "c": np.ascontiguousarray(pred.c, dtype=np.float64),
        "survival": survival,
    }
    return orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)

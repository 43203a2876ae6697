"""Request bodies straight into numpy arrays: orjson, then whole columns, no per-row objects.

Each hot body has a fast decoder that accepts exactly what the strict pydantic model in
:mod:`serving.service.schemas` accepts (same types, same bounds) or answers None. On None the body goes
through the model, whose errors become a 422 with the field path; were the model to accept it
after all, the validated values are decoded by the same column builders. So the fast path can
only be faster, never more permissive (a property test holds the two paths together).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import orjson
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError

from balanceroute.features.constants import MAX_HORIZON
from balanceroute.features.schema import hash_keys
from balanceroute.serving.service.schemas import (
    MAX_OUTPUT_TOKENS,
    MAX_PROMPT_TOKENS,
    ObserveRequest,
    PredictRequest,
)

M = TypeVar("M", bound=BaseModel)
NONE_TYPE = type(None)
MAX_ID_LENGTH = 256
MAX_KEY_LENGTH = 4096
MAX_SECONDS = 1e12
MAX_SELECTOR = 256


@dataclass(frozen=True, slots=True)
class RunningColumns:
    """Running requests as arrays; ``ids`` are echoed back as given."""

    ids: list[int | str]
    prompt_tokens: np.ndarray  # int64
    age: np.ndarray  # int64
    prompt_key: np.ndarray  # uint64, 0 = no key

    @property
    def size(self) -> int:
        return int(self.age.shape[0])


@dataclass(frozen=True, slots=True)
class PredictInput:
    """A decoded ``POST /v1/predict`` body."""

    running: RunningColumns
    model: str | None
    survival: bool
    time_s: float | None
    horizon: int | None


@dataclass(frozen=True, slots=True)
class CompletedColumns:
    """A decoded ``POST /v1/observe`` body."""

    prompt_tokens: np.ndarray  # int64
    output_tokens: np.ndarray  # int64
    prompt_key: np.ndarray  # uint64
    time_s: np.ndarray | None  # float64, NaN where unknown; None when no row has one

    @property
    def size(self) -> int:
        return int(self.output_tokens.shape[0])


def parse_json(raw: bytes) -> Any:
    """orjson-decode a body; malformed JSON is a 422 at ``body``, an empty body a missing one."""
    if not raw:
        raise RequestValidationError(
            [{"type": "missing", "loc": ("body",), "msg": "a JSON body is required"}]
        )
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise RequestValidationError(
            [{"type": "json_invalid", "loc": ("body", exc.pos), "msg": f"invalid JSON: {exc.msg}"}]
        ) from None


def validate(model: type[M], data: Any, how: Callable[[Any], M] | None = None) -> M:
    """Validate with a strict model (or ``how``); errors become a 422 whose locations start at
    ``body``."""
    try:
        return (how or model.model_validate)(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False, include_input=False)
    except ValueError as exc:  # errors collected elsewhere (SliceErrors): {type, loc, msg}
        errors = getattr(exc, "errors", None)
        if errors is None:
            raise
    raise RequestValidationError(
        [{"type": e["type"], "loc": ("body", *e["loc"]), "msg": e["msg"]} for e in errors]
    )


def check_count(data: Any, field: str, limit: int, what: str) -> None:
    """413 when ``data[field]`` lists more than ``limit`` items (checked before validation)."""
    if type(data) is dict:
        items = data.get(field)
        if type(items) is list and len(items) > limit:
            raise HTTPException(
                status_code=413,
                detail=f"at most {limit} {what} per call, got {len(items)}: split the batch",
            )


# ---- column builders: None means "let the model explain" ---------------------------------------


def _column(items: list[dict], name: str, required: bool) -> list[Any] | None:
    if required:
        try:
            return [it[name] for it in items]
        except KeyError:
            return None
    return [it.get(name) for it in items]


def int_column(values: list[Any], lo: int, hi: int) -> np.ndarray | None:
    """int64 array if every value is a JSON integer in ``[lo, hi]`` (booleans are not)."""
    if values and set(map(type, values)) != {int}:
        return None
    try:
        arr = np.array(values, dtype=np.int64)
    except OverflowError:
        return None
    if arr.size and (int(arr.min()) < lo or int(arr.max()) > hi):
        return None
    return arr


def float_column(values: list[Any], lo: float, hi: float) -> np.ndarray | None:
    """float64 array if every value is a finite JSON number in ``[lo, hi]``."""
    if values and not set(map(type, values)) <= {int, float}:
        return None
    try:
        arr = np.array(values, dtype=np.float64)
    except OverflowError:
        return None
    if arr.size and not (np.isfinite(arr).all() and arr.min() >= lo and arr.max() <= hi):
        return None
    return arr


class KeyHasher:
    """``features.schema.hash_keys`` of raw string keys, memoised: templates recur, and hashing
    a batch of strings through pandas costs far more than looking them up in a dictionary.

    Bounded: at most ``capacity`` keys of at most ``cached_length`` characters are kept (the
    table is emptied when full), so unique or long keys cannot grow the server's memory.
    """

    def __init__(self, capacity: int = 65_536, cached_length: int = 256) -> None:
        self.capacity = capacity
        self.cached_length = cached_length
        self.known: dict[str, int] = {}

    def __call__(self, keys: list[str]) -> np.ndarray:
        known = self.known
        try:  # the usual case: every key seen before
            return np.fromiter(map(known.__getitem__, keys), dtype=np.uint64, count=len(keys))
        except KeyError:
            pass
        missing = [k for k in set(keys) if k not in known]
        fresh = dict(zip(missing, hash_keys(missing).tolist(), strict=True))
        out = np.fromiter(
            (known[k] if k in known else fresh[k] for k in keys), dtype=np.uint64, count=len(keys)
        )
        cacheable = [(k, h) for k, h in fresh.items() if len(k) <= self.cached_length]
        if len(known) + len(cacheable) > self.capacity:
            known.clear()
        known.update(cacheable[: self.capacity])
        return out


hash_raw_keys = KeyHasher()


def key_column(values: list[Any]) -> np.ndarray | None:
    """uint64 prompt keys: integers as hashed keys, strings hashed here, null/missing as 0."""
    types = set(map(type, values))
    if types == {str}:
        return hash_raw_keys(values) if max(map(len, values)) <= MAX_KEY_LENGTH else None
    if not types <= {int, str, NONE_TYPE}:
        return None
    if str not in types:
        try:
            return np.array([0 if v is None else v for v in values], dtype=np.uint64)
        except OverflowError:
            return None
    out = np.zeros(len(values), dtype=np.uint64)
    strs = [j for j, v in enumerate(values) if type(v) is str]
    if any(len(values[j]) > MAX_KEY_LENGTH for j in strs):
        return None
    ints = [j for j, v in enumerate(values) if type(v) is int]
    try:
        out[ints] = np.array([values[j] for j in ints], dtype=np.uint64)
    except OverflowError:
        return None
    out[strs] = hash_raw_keys([values[j] for j in strs])
    return out


def id_column(values: list[Any]) -> list[int | str] | None:
    """Request ids as given, if each is an integer in 64-bit range or a short string."""
    types = set(map(type, values))
    if types == {int}:
        return values if -(2**63) <= min(values) and max(values) <= 2**64 - 1 else None
    if types == {str}:
        return values if max(map(len, values)) <= MAX_ID_LENGTH else None
    for v in values:
        t = type(v)
        if t is int:
            if not -(2**63) <= v <= 2**64 - 1:
                return None
        elif t is not str or len(v) > MAX_ID_LENGTH:
            return None
    return values


def _optional_float(data: dict, name: str, lo: float, hi: float) -> tuple[bool, float | None]:
    v = data.get(name)
    if v is None:
        return True, None
    if type(v) not in (int, float) or not lo <= v <= hi:
        return False, None
    return True, float(v)


def running_columns(items: Any) -> RunningColumns | None:
    """Columns of a list of running requests (``RunningRequestIn``), or None."""
    if type(items) is not list or (items and set(map(type, items)) != {dict}):
        return None
    raw = [_column(items, n, True) for n in ("id", "prompt_tokens", "age")]
    if any(col is None for col in raw):
        return None
    ids = id_column(raw[0])
    prompt = int_column(raw[1], 1, MAX_PROMPT_TOKENS)
    age = int_column(raw[2], 0, MAX_OUTPUT_TOKENS)
    keys = key_column(_column(items, "prompt_key", False))
    if ids is None or prompt is None or age is None or keys is None:
        return None
    return RunningColumns(ids=ids, prompt_tokens=prompt, age=age, prompt_key=keys)


def fast_predict(data: Any) -> PredictInput | None:
    """The fast decoder of ``PredictRequest``."""
    if type(data) is not dict or not data.keys() <= PredictRequest.model_fields.keys():
        return None
    requests = data.get("requests")
    if type(requests) is not list or not requests:
        return None
    model = data.get("model")
    if model is not None and (type(model) is not str or not 1 <= len(model) <= MAX_SELECTOR):
        return None
    survival = data.get("survival", False)
    horizon = data.get("horizon")
    if type(survival) is not bool:
        return None
    if horizon is not None and (type(horizon) is not int or not 1 <= horizon <= MAX_HORIZON):
        return None
    ok, time_s = _optional_float(data, "time_s", 0.0, MAX_SECONDS)
    running = running_columns(requests)
    if not ok or running is None:
        return None
    return PredictInput(running, model, survival, time_s, horizon)


def fast_observe(data: Any) -> CompletedColumns | None:
    """The fast decoder of ``ObserveRequest``."""
    if type(data) is not dict or not data.keys() <= ObserveRequest.model_fields.keys():
        return None
    items = data.get("completions")
    if type(items) is not list or not items or set(map(type, items)) != {dict}:
        return None
    prompt_raw = _column(items, "prompt_tokens", True)
    output_raw = _column(items, "output_tokens", True)
    if prompt_raw is None or output_raw is None:
        return None
    prompt = int_column(prompt_raw, 1, MAX_PROMPT_TOKENS)
    output = int_column(output_raw, 1, MAX_OUTPUT_TOKENS)
    keys = key_column(_column(items, "prompt_key", False))
    times_raw = _column(items, "time_s", False)
    if prompt is None or output is None or keys is None:
        return None
    known = [v for v in times_raw if v is not None]
    times = None
    if known:
        if float_column(known, 0.0, MAX_SECONDS) is None:
            return None
        times = np.array([np.nan if v is None else v for v in times_raw], dtype=np.float64)
    return CompletedColumns(prompt, output, keys, times)


def decode(data: Any, fast: Callable[[Any], Any], model: type[BaseModel]) -> Any:
    """Fast decoder, else the model's 422, else (model accepted) the fast decoder on its dump."""
    out = fast(data)
    if out is not None:
        return out
    checked = validate(model, data)
    out = fast(checked.model_dump(exclude_unset=True))
    if out is None:  # pragma: no cover - the property test keeps the two paths equivalent
        raise AssertionError(f"{model.__name__} accepted a body its fast decoder rejects")
    return out


def decode_predict(data: Any, limit: int) -> PredictInput:
    """A ``POST /v1/predict`` body, or a 413/422."""
    check_count(data, "requests", limit, "requests")
    return decode(data, fast_predict, PredictRequest)


def decode_observe(data: Any, limit: int) -> CompletedColumns:
    """A ``POST /v1/observe`` body, or a 413/422."""
    check_count(data, "completions", limit, "completions")
    return decode(data, fast_observe, ObserveRequest)


def running_from_models(items: Sequence[BaseModel]) -> RunningColumns:
    """Columns of validated running requests (for the route snapshot)."""
    out = running_columns([it.model_dump(exclude_unset=True) for it in items])
    if out is None:  # pragma: no cover - validated models always decode
        raise AssertionError("validated running requests failed to decode")
    return out

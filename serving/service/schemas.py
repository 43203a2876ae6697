"""Request and response bodies of the HTTP API (pydantic models, kept apart from the routes).

Request models are strict (JSON numbers are not coerced from strings or booleans) and bound every
number, string and list, so anything they accept is safe to turn into numpy arrays; token counts
and ages follow the input limits of :mod:`balanceroute.features.limits`. The hot
endpoints decode bodies with :mod:`serving.service.decode` and fall back to these models to explain a
rejection; the models are also what the OpenAPI document shows. The routing request, which
depends on the router's registry, lives apart in :mod:`serving.route_schemas`.

Prompt keys: an integer is taken as an already hashed key (``features.schema.hash_keys``, what
the router's request table holds; 0 = no key), a string as a raw key the server hashes the same
way the trace loaders do.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from balanceroute.features.constants import MAX_HORIZON
from balanceroute.features.limits import input_limits
from balanceroute.serving.lifecycle.renew import ReloadOutcome
from balanceroute.serving.service.settings import MAX_REQUESTS, MAX_ROUTE_CELLS

LIMITS = input_limits()
MAX_PROMPT_TOKENS = LIMITS.max_prompt_tokens
MAX_OUTPUT_TOKENS = LIMITS.max_output_tokens
MAX_COUNT = 2**53

PromptTokens = Annotated[
    int, Field(ge=1, le=MAX_PROMPT_TOKENS, description="prompt tokens (input limits)")
]
OutputTokens = Annotated[
    int, Field(ge=1, le=MAX_OUTPUT_TOKENS, description="output tokens (input limits)")
]
Age = Annotated[
    int, Field(ge=0, le=MAX_OUTPUT_TOKENS, description="tokens generated so far (<= output limit)")
]
Count = Annotated[int, Field(ge=0, le=MAX_COUNT)]
Seconds = Annotated[float, Field(ge=0, le=1e12, allow_inf_nan=False)]
HashedKey = Annotated[int, Field(ge=0, le=2**64 - 1)]
RawKey = Annotated[str, Field(max_length=4096)]
PromptKey = HashedKey | RawKey | None
RequestId = Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | Annotated[str, Field(max_length=256)]
Selector = Annotated[str, Field(min_length=1, max_length=256)]
STRICT = ConfigDict(strict=True, extra="forbid")
STRICT_OPEN = ConfigDict(strict=True, extra="ignore")


class RunningRequestIn(BaseModel):
    """A request in service; fields other than these are accepted and ignored."""

    model_config = STRICT_OPEN

    id: RequestId
    prompt_tokens: PromptTokens
    age: Age
    prompt_key: PromptKey = None


class PredictRequest(BaseModel):
    """``POST /v1/predict``: running requests to predict for."""

    model_config = STRICT

    requests: Annotated[list[RunningRequestIn], Field(min_length=1, max_length=MAX_REQUESTS)]
    model: Selector | None = Field(
        default=None, description="arm (a, b), alias or version of a loaded model; default a"
    )
    survival: bool = Field(default=False, description="also return survival curves P(r > h)")
    time_s: Seconds | None = Field(default=None, description="time of the snapshot, if known")
    horizon: Annotated[int, Field(ge=1, le=MAX_HORIZON)] | None = Field(
        default=None,
        description="answer for this horizon H (the model's, or a shorter one from its curves)",
    )


class CompletedRequestIn(BaseModel):
    """A request that finished: what the online estimators learn from."""

    model_config = STRICT_OPEN

    prompt_tokens: PromptTokens
    output_tokens: OutputTokens
    prompt_key: PromptKey = None
    time_s: Seconds | None = None


class ObserveRequest(BaseModel):
    """``POST /v1/observe``: completions in finish order."""

    model_config = STRICT

    completions: Annotated[list[CompletedRequestIn], Field(min_length=1, max_length=MAX_REQUESTS)]


class WorkerIn(BaseModel):
    """One decode worker of the snapshot."""

    model_config = STRICT

    load: Annotated[float, Field(ge=0, le=1e15, allow_inf_nan=False)] | None = Field(
        default=None, description="KV tokens; default: sum of its running workloads"
    )
    free_slots: Annotated[int, Field(ge=0, le=MAX_ROUTE_CELLS)]
    running: Annotated[list[RunningRequestIn], Field(max_length=MAX_REQUESTS)] = []


class PoolRequestIn(BaseModel):
    """A waiting request, in release order (oldest first)."""

    model_config = STRICT_OPEN

    id: RequestId
    prompt_tokens: PromptTokens
    prompt_key: PromptKey = None
    waited_s: Seconds = 0.0
    waited_iterations: Count = 0
    overtaken: Count = Field(default=0, description="later requests admitted while it waited")


class ReloadRequest(BaseModel):
    """``POST /v1/admin/reload``: which model slot (default all), and whether to reload unchanged
    ones. ``slot`` is the name; ``arm``, its name before, is still accepted."""

    model_config = STRICT

    slot: Literal["a", "b"] | None = None
    arm: Literal["a", "b"] | None = Field(default=None, description="the old name of slot")
    force: bool = False

    @model_validator(mode="after")
    def _one_slot(self) -> ReloadRequest:
        if self.slot is not None and self.arm is not None and self.slot != self.arm:
            raise ValueError("slot and arm (its old name) name different slots")
        return self

    @property
    def target(self) -> str | None:
        """The slot asked for (None: all)."""
        return self.slot if self.slot is not None else self.arm


class ModelRef(BaseModel):
    """The model that answered (``arm``: its slot; the field keeps its first name, for clients)."""

    arm: str
    name: str
    version: str
    kind: str


class PredictResponse(BaseModel):
    """Predictions in request order; ``survival`` is ``n x (H+1)`` when asked for and known."""

    model: ModelRef
    horizon: int
    ids: list[int | str]
    p_finish: list[float]
    c: list[float]
    survival: list[list[float]] | None = None


class ObserveResponse(BaseModel):
    """How many completions were fed, and to which model slots (``arms``: the field keeps its
    first name, for clients)."""

    observed: int
    arms: list[str]


class AdmissionOut(BaseModel):
    """Pool request ``id`` goes to worker ``worker`` (index in the posted list)."""

    id: int | str
    worker: int


class RouteResponse(BaseModel):
    """The decision, in admission order, with the resolved policy configuration."""

    admissions: list[AdmissionOut]
    policy: dict[str, Any]
    model: ModelRef | None = None
    fallback: str | None = Field(
        default=None, description="why brh ran without the model's predictions, if it did"
    )


class ArmInfo(BaseModel):
    """A loaded model, its slot (``arm``: the field and the schema keep their first name, for
    clients) and where it came from."""

    arm: str
    uri: str
    source: Literal["mlflow", "file"]
    name: str
    version: str
    kind: str
    horizon: int
    provides_survival: bool
    aliases: list[str]
    run_id: str | None = None
    metrics: dict[str, float] = {}
    params: dict[str, Any] = {}
    loaded_at: str


class ModelsResponse(BaseModel):
    """Every loaded model slot (``arms``: the field keeps its first name, for clients);
    ``default`` answers calls without a selector."""

    default: str
    arms: list[ArmInfo]
    selectors: list[str]


class ReloadResponse(BaseModel):
    """One outcome per arm considered."""

    arms: list[ReloadOutcome]


class StatusResponse(BaseModel):
    """Probe answer."""

    status: str
    detail: str | None = None


REQUEST_MODELS: tuple[type[BaseModel], ...] = (PredictRequest, ObserveRequest, ReloadRequest)

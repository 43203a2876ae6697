"""``balanceroute serve``'s configuration: :class:`ServeSettings` extends the shared HTTP settings
(:mod:`balanceroute.serving.http.settings`) with the models, the per-call bounds and the timing."""

from __future__ import annotations

from pydantic import Field, field_validator

from balanceroute.serving.http.settings import ServiceSettings, load_settings

MAX_REQUESTS = 16_384
MAX_ROUTE_CELLS = 2**20  # workers x slots of one /v1/route call can be allowed at most


class ServeSettings(ServiceSettings):
    """Everything ``balanceroute serve`` needs besides :class:`ServiceSettings`."""

    model_uri: str = Field(
        description="model slot a: models:/NAME@ALIAS, models:/NAME/VERSION or a local .joblib path"
    )
    model_uri_b: str | None = Field(default=None, description="optional model slot b, same forms")
    max_requests: int = Field(
        default=MAX_REQUESTS, ge=1, le=MAX_REQUESTS, description="requests per call at most"
    )
    replay_buffer: int = Field(
        default=65_536,
        ge=0,
        le=1_048_576,
        description="recent completions kept to warm up a model loaded by a reload",
    )
    warm_router: bool = Field(
        default=True,
        description="compile the router's kernels at startup (false: on the first /v1/route "
        "call, which then pays for it)",
    )
    lightgbm_threads: int = Field(
        default=1,
        ge=1,
        le=256,
        description="LightGBM threads in the server (docs/design.md, 'LightGBM in a server')",
    )
    route_deadline_s: float = Field(
        default=2.0,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="a /v1/route call still undecided after this many seconds answers 503",
    )
    max_route_cells: int = Field(
        default=65_536,
        ge=1,
        le=MAX_ROUTE_CELLS,
        description="workers x slots of one /v1/route snapshot at most (422 above)",
    )
    max_route_window: int = Field(
        default=1024, ge=1, le=MAX_REQUESTS, description="the option 'window' at most"
    )
    max_route_r_max: int = Field(default=6, ge=1, le=8, description="the option 'r_max' at most")
    max_route_work: float = Field(
        default=1e9,
        gt=0,
        le=1e12,
        allow_inf_nan=False,
        description="estimated work of one /v1/route decision at most, in units of about a "
        "nanosecond (serving/service/routes/route.py, route_work)",
    )
    observe_inline_rows: int = Field(
        default=256,
        ge=0,
        le=MAX_REQUESTS,
        description="observe batches up to this size update the model in place; larger ones "
        "update a copy in a worker thread, swapped in when done (predictions never wait)",
    )
    load_retry_s: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        allow_inf_nan=False,
        description="longest wait between retries of a failed first model load",
    )

    @field_validator("model_uri_b", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    def uris(self) -> dict[str, str]:
        """Configured model URI per slot label."""
        out = {"a": self.model_uri}
        if self.model_uri_b:
            out["b"] = self.model_uri_b
        return out


def load_serve_settings(overrides: dict[str, object] | None = None) -> ServeSettings:
    """``serve``'s settings from ``BALANCEROUTE_*`` and ``overrides`` (UserErrors if invalid)."""
    return load_settings(overrides, cls=ServeSettings)

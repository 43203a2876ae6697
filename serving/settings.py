"""The service's configuration: one pydantic-settings class, from flags or ``BALANCEROUTE_*``."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_REQUESTS = 16_384
MIN_TOKEN_LENGTH = 16
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
LogLevel = Literal["critical", "error", "warning", "info", "debug", "trace"]
_HOSTNAME = re.compile(
    r"^(?=.{1,253}$)[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?(\.[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?$"
)


def check_host(host: str) -> str:
    """``host`` if it is an IP address or a host name; a ValueError saying which it is not."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    if all(part.isdigit() for part in host.split(".")) or not _HOSTNAME.match(host):
        raise ValueError(f"'{host}' is not a valid IP address or host name")
    return host


def is_loopback(host: str) -> bool:
    """Whether ``host`` only listens on this machine (localhost or a loopback address)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServeSettings(BaseSettings):
    """Everything ``balanceroute serve`` needs; environment variables use the prefix below.

    Unsafe configurations are refused: a bearer token shorter than 16 characters, and listening
    beyond loopback without a token unless ``allow_unauthenticated`` says so explicitly.
    """

    model_config = SettingsConfigDict(env_prefix="BALANCEROUTE_", extra="ignore")

    model_uri: str = Field(
        description="arm a: models:/NAME@ALIAS, models:/NAME/VERSION or a local .joblib path"
    )
    model_uri_b: str | None = Field(default=None, description="optional arm b, same forms")
    host: str = Field(default="127.0.0.1", description="address to listen on")
    allowed_hosts: str = Field(
        default="",
        description="host names, comma-separated, that the Host header may name besides "
        "loopback ones ('*': any, only behind a proxy that checks it)",
    )
    allowed_origins: str = Field(
        default="",
        description="browser origins (scheme://host[:port]), comma-separated, allowed to call "
        "the API; a call with another Origin header gets 403",
    )
    port: int = Field(default=8080, ge=0, le=65535, description="TCP port (0 = any free one)")
    api_token: SecretStr | None = Field(
        default=None, description="bearer token required by every endpoint but the probes"
    )
    allow_unauthenticated: bool = Field(
        default=False, description="allow listening beyond loopback without a token"
    )
    max_requests: int = Field(
        default=MAX_REQUESTS, ge=1, le=MAX_REQUESTS, description="requests per call at most"
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="request bodies above this get 413",
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
        le=2**20,
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
        "nanosecond (serving/routes/route.py, route_work)",
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
    log_level: LogLevel = Field(default="info", description="log level (uvicorn and model swaps)")
    access_log: bool = Field(default=False, description="uvicorn access log (costs latency)")

    @field_validator("api_token", "model_uri_b", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, value: object) -> object:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("host")
    @classmethod
    def _valid_host(cls, value: str) -> str:
        return check_host(value)

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> ServeSettings:
        token = self.api_token.get_secret_value() if self.api_token is not None else None
        if token is not None and (
            len(token) < MIN_TOKEN_LENGTH or any(c.isspace() or not c.isprintable() for c in token)
        ):
            raise ValueError(
                f"BALANCEROUTE_API_TOKEN must be at least {MIN_TOKEN_LENGTH} characters, "
                "printable, without spaces"
            )
        if token is None and not is_loopback(self.host) and not self.allow_unauthenticated:
            raise ValueError(
                f"refusing to listen on {self.host} without a bearer token: set "
                "BALANCEROUTE_API_TOKEN, or BALANCEROUTE_ALLOW_UNAUTHENTICATED=true"
            )
        return self

    @property
    def token(self) -> str | None:
        """The bearer token in clear, or None when the service is open."""
        return None if self.api_token is None else self.api_token.get_secret_value()

    def host_allowlist(self) -> frozenset[str]:
        """Host names (lower case, no port) a request may be addressed to."""
        given = {h.strip().lower() for h in self.allowed_hosts.split(",") if h.strip()}
        return frozenset({*LOOPBACK_NAMES, *given})

    def origin_allowlist(self) -> frozenset[str]:
        """Browser origins allowed to call the API."""
        return frozenset(
            o.strip().rstrip("/").lower() for o in self.allowed_origins.split(",") if o.strip()
        )

    def uris(self) -> dict[str, str]:
        """Configured model URI per arm label."""
        out = {"a": self.model_uri}
        if self.model_uri_b:
            out["b"] = self.model_uri_b
        return out

"""The service's configuration: one pydantic-settings class, from flags or ``BALANCEROUTE_*``."""

from __future__ import annotations

import ipaddress

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

MAX_REQUESTS = 16_384
MIN_TOKEN_LENGTH = 16


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
        default=32 * 1024 * 1024, ge=1024, description="request bodies above this get 413"
    )
    replay_buffer: int = Field(
        default=65_536,
        ge=0,
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
        description="LightGBM threads in the server (docs/design.md, 'LightGBM in a server')",
    )
    log_level: str = Field(default="info", description="log level (uvicorn and model swaps)")
    access_log: bool = Field(default=False, description="uvicorn access log (costs latency)")

    @field_validator("api_token", "model_uri_b", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _refuse_unsafe(self) -> ServeSettings:
        token = self.api_token.get_secret_value() if self.api_token is not None else None
        if token is not None and len(token) < MIN_TOKEN_LENGTH:
            raise ValueError(
                f"BALANCEROUTE_API_TOKEN must be at least {MIN_TOKEN_LENGTH} characters"
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

    def uris(self) -> dict[str, str]:
        """Configured model URI per arm label."""
        out = {"a": self.model_uri}
        if self.model_uri_b:
            out["b"] = self.model_uri_b
        return out

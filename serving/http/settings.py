"""The base of every HTTP process's configuration (pydantic-settings, from flags or
``BALANCEROUTE_*``): :class:`ServiceSettings` holds what they share (listening, the bearer token,
the Host and Origin allow-lists); ``serve`` and ``gateway`` extend it."""

from __future__ import annotations

import ipaddress
import re
from typing import Literal, TypeVar

from pydantic import Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from balanceroute.features.errors import UserError

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


class ServiceSettings(BaseSettings):
    """What every BalanceRoute HTTP process shares: where it listens, who may call it (bearer
    token, Host and Origin allow-lists), body size and logging; from ``BALANCEROUTE_*``.

    Unsafe configurations are refused: a bearer token shorter than 16 characters, and listening
    beyond loopback without a token unless ``allow_unauthenticated`` says so explicitly.
    """

    model_config = SettingsConfigDict(env_prefix="BALANCEROUTE_", extra="ignore")

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
    api_token: SecretStr | None = Field(  # a secret: never a flag (``ps`` would show it)
        default=None, description="bearer token required by every endpoint but the probes",
        json_schema_extra={"flag": None},
    )  # fmt: skip
    allow_unauthenticated: bool = Field(
        default=False, description="allow listening beyond loopback without a token"
    )
    max_body_bytes: int = Field(
        default=32 * 1024 * 1024,
        ge=1024,
        le=1024**3,
        description="request bodies above this get 413",
    )
    header_timeout_s: float = Field(
        default=10.0, gt=0, le=3600,
        description="a connection's request headers must arrive within this (from its opening, "
        "or the next request's first byte); else 408 and closed",
    )  # fmt: skip
    body_timeout_s: float = Field(
        default=60.0, gt=0, le=3600,
        description="a request's body must arrive within this after its headers; else closed",
    )  # fmt: skip
    idle_timeout_s: float = Field(
        default=5.0, gt=0, le=3600,
        description="a kept-alive connection idle this long between requests is closed",
    )  # fmt: skip
    log_level: LogLevel = Field(default="info", description="log level (uvicorn and model swaps)")
    access_log: bool = Field(default=False, description="uvicorn access log (costs latency)")

    @field_validator("api_token", mode="before")
    @classmethod
    def _empty_token_is_unset(cls, value: object) -> object:
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
    def _refuse_unsafe(self) -> ServiceSettings:
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


S = TypeVar("S", bound=ServiceSettings)


def load_settings(overrides: dict[str, object] | None = None, *, cls: type[S]) -> S:
    """Settings of class ``cls`` from ``BALANCEROUTE_*`` and ``overrides``; invalid ones are
    one-line UserErrors."""
    given = {k: v for k, v in (overrides or {}).items() if v is not None}
    try:
        return cls(**given)
    except ValidationError as exc:
        raise UserError(
            "; ".join(
                f"{'.'.join(map(str, e['loc'])) or 'settings'}: {e['msg']}" for e in exc.errors()
            )
        ) from None

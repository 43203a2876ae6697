"""The gateways and services a promotion reloads, over their existing operator endpoints.

A gateway reloads with ``POST /admin/reload``, a service with ``POST /v1/admin/reload``; both
answer 200 when every model swapped or was unchanged and 502 when one failed to load (the old
model keeps serving). When ``BALANCEROUTE_API_TOKEN`` is set the call carries it as
``Authorization: Bearer`` (the same variable the servers read). Before the champion moves, every
target is reached once (``GET /v1/models``, token included), so an unreachable or misconfigured
target fails the cycle while the registry is still untouched.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Literal

import httpx

from balanceroute.features.errors import UserError

RELOAD_PATHS = {"gateway": "/admin/reload", "service": "/v1/admin/reload"}
TOKEN_ENV = "BALANCEROUTE_API_TOKEN"


class ReloadError(UserError):
    """A target could not be reached or refused a reload."""

    exit_code = 4


@dataclass(frozen=True)
class Target:
    """One process to reload: its kind and base URL."""

    kind: Literal["gateway", "service"]
    url: str

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise UserError(
                f"{self.kind} URL must start with http:// or https://, got {self.url!r}"
            )

    @property
    def name(self) -> str:
        """``gateway URL`` or ``service URL``, for messages."""
        return f"{self.kind} {self.url}"


def _headers() -> dict[str, str]:
    token = os.environ.get(TOKEN_ENV)
    return {"authorization": f"Bearer {token}"} if token else {}


def check_reachable(target: Target, timeout_s: float = 10.0) -> None:
    """Raise a ReloadError unless ``target`` answers its authenticated ``GET /v1/models``."""
    try:
        r = httpx.get(
            target.url.rstrip("/") + "/v1/models",
            headers=_headers(),
            timeout=timeout_s,
            trust_env=False,
        )
    except httpx.HTTPError as exc:
        raise ReloadError(f"{target.name} is unreachable ({exc})") from None
    if r.status_code == 401:
        raise ReloadError(f"{target.name} refused the token (set {TOKEN_ENV} as on the server)")
    if r.status_code != 200:
        raise ReloadError(f"{target.name} answered {r.status_code} to GET /v1/models")


def reload(target: Target, timeout_s: float = 120.0) -> dict:
    """Ask ``target`` to reload; its answer, or a ReloadError saying what failed."""
    url = target.url.rstrip("/") + RELOAD_PATHS[target.kind]
    try:
        r = httpx.post(url, headers=_headers(), json={}, timeout=timeout_s, trust_env=False)
    except httpx.HTTPError as exc:
        raise ReloadError(f"{target.name}: reload failed ({exc})") from None
    if r.status_code != 200:
        raise ReloadError(f"{target.name}: reload answered {r.status_code}: {r.text[:300]}")
    return r.json()

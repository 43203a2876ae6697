"""The bearer-token check every BalanceRoute HTTP process shares (``serve`` and ``gateway``).

The token comes from the app's settings (``request.app.state.settings.token``); with none
configured, the service is open (loopback only, see :class:`~balanceroute.serving.service.settings.ServiceSettings`).
"""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

bearer = HTTPBearer(
    auto_error=False,
    description="required when the server has BALANCEROUTE_API_TOKEN set",
)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)]


def authorized(request: Request) -> bool:
    """Whether the call carries the configured bearer token (always, with none configured)."""
    token = request.app.state.settings.token
    if token is None:
        return True
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.encode(), token.encode())


async def require_token(request: Request, credentials: Credentials) -> None:
    """401 unless the call carries the configured bearer token (no token configured: open)."""
    token = request.app.state.settings.token
    if token is None:
        return
    given = credentials.credentials if credentials is not None else ""
    if not hmac.compare_digest(given.encode(), token.encode()):
        raise HTTPException(
            status_code=401,
            detail="missing or invalid bearer token",
            headers={"WWW-Authenticate": "Bearer"},
        )


Authorized = Depends(require_token)

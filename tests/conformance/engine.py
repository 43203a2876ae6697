"""Where the real engine under test is: read from the CONFORMANCE_* variables conformance.sh sets."""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True)
class Engine:
    """The real ranks (URL mode), the optional data-parallel server (header mode) and the model."""

    ranks: list[str]
    model: str
    dp_url: str | None
    dp_size: int
    dp_api_key: str | None
    stop_pid: int | None

    @property
    def dp_headers(self) -> dict[str, str]:
        """Authorization for the data-parallel server, if it needs a key."""
        return {"Authorization": f"Bearer {self.dp_api_key}"} if self.dp_api_key else {}


def engine_from_env() -> Engine | None:
    """The engine described by the environment, or None when CONFORMANCE_RANKS is unset."""
    ranks = [u.strip().rstrip("/") for u in os.environ.get("CONFORMANCE_RANKS", "").split(",")]
    ranks = [u for u in ranks if u]
    if not ranks:
        return None
    pid = os.environ.get("CONFORMANCE_STOP_PID")
    return Engine(
        ranks=ranks,
        model=os.environ.get("CONFORMANCE_MODEL", "tiny"),
        dp_url=os.environ.get("CONFORMANCE_DP_URL") or None,
        dp_size=int(os.environ.get("CONFORMANCE_DP_SIZE", "2")),
        dp_api_key=os.environ.get("CONFORMANCE_DP_API_KEY") or None,
        stop_pid=int(pid) if pid else None,
    )

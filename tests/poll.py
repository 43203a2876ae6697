"""The live tests' one poll helper: wait, bounded, until a check holds (a bound, not a sleep)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any


def until(
    check: Callable[[], Any],
    timeout_s: float = 30.0,
    what: str = "",
    *,
    poll_s: float = 0.05,
    every: Callable[[], Any] | None = None,
) -> Any:
    """Poll ``check`` until it returns something truthy and return that; ``every`` runs before
    each poll (traffic to keep a test going); AssertionError naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        if every is not None:
            every()
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s: {what or check}")
        time.sleep(poll_s)


async def until_async(
    check: Callable[[], Any], timeout_s: float = 30.0, what: str = "", *, poll_s: float = 0.005
) -> Any:
    """:func:`until` inside an event loop: the loop runs between polls."""
    deadline = time.monotonic() + timeout_s
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached within {timeout_s:g} s: {what or check}")
        await asyncio.sleep(poll_s)

"""The events between a relay worker and the decider: one JSON array per line on a Unix socket,
a handful per request (never one per chunk).

Worker to decider (``rid``: the worker's own request number):

- ``[ADMIT, rid, prompt_tokens, key_hash, key, request_id, stream]``: queue a request;
- ``[FIRST, rid, t]``: its first token reached the worker at monotonic time ``t``;
- ``[FINISH, rid, rank, first_t, last_t, output_tokens, prompt_tokens, finish_reason]``;
- ``[SUSPECT, rid, rank, why]`` / ``[REFUSED, rid, rank, status]``: the rank failed it before
  its first token (or refused the gateway's key);
- ``[REQUEUE, rid, rank, last]``: route it again (the decider answers ``ASSIGN``);
- ``[ABANDON, rid, outcome]``: it ended otherwise (``outcome`` counted when not null);
- ``[COUNT, rid, outcome]``: an outcome to count, nothing else.

Decider to worker: ``[ASSIGN, rid, rank]`` (rank -1: no rank, give up) and
``[REJECT, rid, status, message]`` (pool full: 429; no rank in rotation or draining: 503).
Both sides' times are ``time.monotonic()``, one clock per machine.
"""

from __future__ import annotations

from typing import Any

import orjson

ADMIT, FIRST, FINISH, SUSPECT, REFUSED, REQUEUE, ABANDON, COUNT = range(8)
ASSIGN, REJECT = 100, 101
LIMIT = 1 << 20  # the longest line either side accepts (an admission carries its prompt key)


def encode(*fields: Any) -> bytes:
    """One event as a line."""
    return orjson.dumps(fields) + b"\n"


def decode(line: bytes) -> list[Any]:
    """One line as an event; ValueError naming it when it is not one."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise ValueError(f"not an event line: {line[:80]!r} ({exc})") from None
    if not isinstance(event, list) or not event or not isinstance(event[0], int):
        raise ValueError(f"not an event line: {line[:80]!r}")
    return event

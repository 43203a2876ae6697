"""Server-Sent Events as OpenAI-compatible servers stream them: ``data: {json}`` events separated
by a blank line, ``data: [DONE]`` at the end, ``: comments`` ignored by clients.

A *token chunk* is one whose choice carries text (``text`` for completions, ``delta.content``
for chat; vLLM's first chat chunk, the role with empty content, is not a token).
"""

from __future__ import annotations

from typing import Any

import orjson

DONE_PAYLOAD = b"[DONE]"
DONE = b"data: " + DONE_PAYLOAD + b"\n\n"
SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
]


def encode(obj: Any) -> bytes:
    """One ``data:`` event carrying ``obj`` as JSON."""
    return b"data: " + orjson.dumps(obj) + b"\n\n"


class EventSplitter:
    """Cuts a byte stream, read in pieces of any size, into whole events (without the blank
    line that ends each)."""

    __slots__ = ("buf",)

    def __init__(self) -> None:
        self.buf = b""

    def feed(self, data: bytes) -> list[bytes]:
        """The events ``data`` completes (none while the current one is unfinished)."""
        buf = self.buf + data
        if b"\n\n" not in buf:
            self.buf = buf
            return []
        *events, self.buf = buf.split(b"\n\n")
        return events


def data_payload(event: bytes) -> bytes | None:
    """What a ``data:`` event carries (None: a comment or an empty event)."""
    text = event.strip()
    if not text.startswith(b"data:"):
        return None
    return text[5:].strip()


def token_text(choice: dict[str, Any]) -> str | None:
    """The text a chunk's choice carries (None: not a token chunk)."""
    if "text" in choice:
        return choice["text"]
    delta = choice.get("delta")
    if not delta:
        return None
    content = delta.get("content")
    if content is None or (content == "" and "role" in delta):
        return None
    return content

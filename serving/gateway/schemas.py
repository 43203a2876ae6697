"""What the gateway checks in an OpenAI request body before it queues it.

Only the fields the gateway reads are checked (anything else passes through to the rank
unchanged, which has the last word on sampling options): one prompt (text, token ids, or chat
messages), ``n = 1`` (one request is one sequence on one rank), ``stream`` and
``stream_options`` of the right types, ``max_tokens`` at least 1. A body that fails gets a 422
listing each error as ``{"loc", "msg", "type"}``, as ``serve`` answers.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, model_validator


class StreamOptions(BaseModel):
    """``stream_options``: usage in the last chunk, or in every chunk."""

    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, le=1, description="one sequence a request")
    max_tokens: StrictInt | None = Field(default=None, ge=1)


class CompletionBody(_Common):
    """``POST /v1/completions``: one prompt, text or token ids (a batch of one is accepted)."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionBody:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list) and len(p) != 1:
            raise ValueError(f"the gateway routes one prompt a request, got a batch of {len(p)}")
        if not self.single_prompt():
            raise ValueError("the prompt is empty")
        return self

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids."""
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], str | list):
            return p[0]  # type: ignore[return-value]
        return p  # type: ignore[return-value]


class ChatMessage(BaseModel):
    """One chat message (other fields pass through)."""

    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None


class ChatBody(_Common):
    """``POST /v1/chat/completions``: at least one message."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)

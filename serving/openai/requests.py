"""OpenAI request bodies, completions and chat, in the two views the test bed and the gateway
take of them.

- The engine's view (:class:`CompletionRequest`, :class:`ChatCompletionRequest`), what the
  emulator accepts: every field vLLM's and SGLang's completion and chat APIs commonly accept is
  declared (sampling parameters are accepted and ignored: the emulator's text is filler); an
  unknown field is logged and ignored, as vLLM does; wrong types and out-of-range values get a 400.
- The gateway's view (:class:`CompletionBody`, :class:`ChatBody`): only the fields the gateway
  reads are checked (anything else passes through to the rank unchanged, which has the last word
  on sampling options): one prompt (text, token ids, or chat messages), ``n = 1`` (one request is
  one sequence on one rank), ``stream`` and ``stream_options`` of the right types, ``max_tokens``
  at least 1, ``stream_options`` only with ``stream: true`` (as vLLM). A body that fails gets
  vLLM's 400 ``BadRequestError`` naming each bad field (:mod:`balanceroute.serving.gateway.errors`);
  ``n > 1`` and batch prompts are refused so, with the reason (the gateway routes one sequence a
  request; send several requests).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    model_validator,
)

log = logging.getLogger("balanceroute.emulator")
Prompt = str | list[int]


def prompt_batch(prompt: Any) -> list[Prompt]:
    """The prompts of a completion request's ``prompt``: one text or token-id list, or a batch of
    them (a list of texts or of token-id lists)."""
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], str | list):
        return list(prompt)
    return [prompt]


# ---- the engine's view (the emulator) ----------------------------------------------------------
def _log_unknown(model: BaseModel) -> None:
    """vLLM's warning for the fields a request carried that no one reads."""
    extra = model.model_extra or {}
    if extra:
        log.warning(
            "The following fields were present in the request but ignored: %s", sorted(extra)
        )


class StreamOptions(BaseModel):
    """``stream_options``: ``include_usage`` adds a last chunk with the token counts."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _unknown(self) -> StreamOptions:
        _log_unknown(self)
        return self

    include_usage: bool = False
    continuous_usage_stats: bool = False


class _Common(BaseModel):
    """Fields both endpoints share (unknown ones logged and ignored, as vLLM)."""

    model_config = ConfigDict(extra="allow")

    @model_validator(mode="after")
    def _unknown(self) -> _Common:
        _log_unknown(self)
        return self

    model: str | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    min_p: float | None = Field(default=None, ge=0, le=1)
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    presence_penalty: float | None = Field(default=None, ge=-2, le=2)
    frequency_penalty: float | None = Field(default=None, ge=-2, le=2)
    repetition_penalty: float | None = Field(default=None, gt=0)
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0)
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    request_id: str | None = None
    priority: int = 0

    def _as_vllm(self, max_tokens: int | None) -> None:
        """What vLLM 0.32 refuses with a 400 although each field is well typed."""
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        if max_tokens is not None and self.min_tokens > max_tokens:
            raise ValueError(f"min_tokens must be less than or equal to max_tokens={max_tokens}, "
                             f"got {self.min_tokens}.")  # fmt: skip


class CompletionRequest(_Common):
    """``POST /v1/completions``: one prompt (text, or token ids)."""

    @model_validator(mode="after")
    def _vllm_rules(self) -> CompletionRequest:
        self._as_vllm(self.max_tokens)
        return self

    prompt: str | list[StrictInt] | list[str] | list[list[StrictInt]]
    max_tokens: int | None = Field(default=16, ge=1)
    best_of: int | None = Field(default=None, ge=1)
    logprobs: int | None = Field(default=None, ge=0)
    prompt_logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    add_special_tokens: bool = True
    return_tokens_as_token_ids: bool | None = None


class ContentPart(BaseModel):
    """One part of a chat message's content (only text parts count as prompt tokens)."""

    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    """One chat message (tool and name fields are tolerated)."""

    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[ContentPart] | None = None


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``: the prompt is the text of the messages."""

    messages: list[ChatMessage] = Field(min_length=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None

    @model_validator(mode="after")
    def _vllm_rules(self) -> ChatCompletionRequest:
        self._as_vllm(self.max_completion_tokens or self.max_tokens)
        choice = self.tool_choice
        if choice is None or choice == "none":
            return self
        if not self.tools:
            raise ValueError("When using `tool_choice`, `tools` must be set.")
        if choice == "auto":  # the emulator has no tool parser (vLLM's flags)
            raise ValueError('"auto" tool choice requires --enable-auto-tool-choice and '
                             "--tool-call-parser to be set")  # fmt: skip
        fn = choice.get("function") if isinstance(choice, dict) else None
        named = isinstance(choice, dict) and choice.get("type") == "function"
        name = fn.get("name") if named and isinstance(fn, dict) else None
        if choice != "required" and not isinstance(name, str):
            raise ValueError(f"Invalid value for `tool_choice`: {choice!r}")
        return self


# ---- the gateway's view ----------------------------------------------------------------------
class PassStreamOptions(BaseModel):
    """``stream_options`` as the gateway checks it: usage in the last chunk, or in every chunk."""

    model_config = ConfigDict(extra="allow")
    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False


class _PassCommon(BaseModel):
    """Fields the gateway reads (strict types; anything else passes through)."""

    model_config = ConfigDict(extra="allow")
    model: StrictStr | None = None
    stream: StrictBool = False
    stream_options: PassStreamOptions | None = None
    n: StrictInt = Field(default=1, ge=1, description="one sequence a request")
    max_tokens: StrictInt | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _one_sequence(self) -> _PassCommon:
        if self.n != 1:
            raise ValueError(
                f"n = {self.n}: the gateway routes one sequence a request (one request is one "
                "sequence on one rank); send n separate requests"
            )
        if self.stream_options is not None and not self.stream:
            raise ValueError("Stream options can only be defined when `stream=True`.")
        return self


class CompletionBody(_PassCommon):
    """``POST /v1/completions``: one prompt, text or token ids (a batch of one is accepted)."""

    prompt: StrictStr | list[StrictInt] | list[StrictStr] | list[list[StrictInt]]

    @model_validator(mode="after")
    def _one_prompt(self) -> CompletionBody:
        batch = prompt_batch(self.prompt)
        if len(batch) != 1:
            raise ValueError(
                f"a batch of {len(batch)} prompts: the gateway routes one prompt a request (one "
                "request is one sequence on one rank); send one request a prompt"
            )
        if not batch[0]:
            raise ValueError("the prompt is empty")
        return self

    def single_prompt(self) -> str | list[int]:
        """The one prompt: text or token ids."""
        return prompt_batch(self.prompt)[0]


class PassChatMessage(BaseModel):
    """One chat message as the gateway checks it (other fields pass through)."""

    model_config = ConfigDict(extra="allow")
    role: StrictStr
    content: StrictStr | list[dict[str, Any]] | None = None


class ChatBody(_PassCommon):
    """``POST /v1/chat/completions``: at least one message."""

    messages: list[PassChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = Field(default=None, ge=1)


@dataclass(frozen=True, slots=True)
class BodyView:
    """What the gateway reads of a checked body: streaming, the usage asked for, and a
    completion's one prompt (None for chat)."""

    stream: bool
    usage: bool
    continuous: bool
    prompt: str | list[int] | None

    @classmethod
    def of(cls, body: CompletionBody | ChatBody) -> BodyView:
        """The view of a body the model accepted."""
        options = body.stream_options
        prompt = body.single_prompt() if isinstance(body, CompletionBody) else None
        usage = bool(options and options.include_usage)
        return cls(body.stream, usage, bool(options and options.continuous_usage_stats), prompt)


def _plain_int(value: Any, least: int) -> bool:
    return value is None or (type(value) is int and value >= least)


def _plain_message(m: Any) -> bool:
    """A chat message the model accepts as it is: a text role, and text, parts or no content."""
    if type(m) is not dict or type(m.get("role")) is not str:
        return False
    content = m.get("content")
    if content is None or type(content) is str:
        return True
    return type(content) is list and all(type(c) is dict for c in content)


def plain_view(data: dict[str, Any], chat: bool) -> BodyView | None:
    """The view of a body whose checked fields all have plain types and values, each as the
    model requires (so the model accepts it, in a fraction of its time); None where the model
    must decide (its 400 names what is wrong)."""
    get = data.get
    stream, options, n = get("stream", False), get("stream_options"), get("n", 1)
    if type(stream) is not bool or not (get("model") is None or type(get("model")) is str):
        return None
    if type(n) is not int or n != 1 or not _plain_int(get("max_tokens"), 1):
        return None
    usage = continuous = False
    if options is not None:
        if type(options) is not dict or not stream:
            return None
        usage = options.get("include_usage", False)
        continuous = options.get("continuous_usage_stats", False)
        if type(usage) is not bool or type(continuous) is not bool:
            return None
    if chat:
        messages = get("messages")
        plain = type(messages) is list and messages and all(map(_plain_message, messages))
        if not plain or not _plain_int(get("max_completion_tokens"), 1):
            return None
        return BodyView(stream, usage, continuous, None)
    prompt = get("prompt")
    if type(prompt) is str and prompt:
        return BodyView(stream, usage, continuous, prompt)
    if type(prompt) is list and prompt and all(type(t) is int for t in prompt):
        return BodyView(stream, usage, continuous, prompt)
    return None

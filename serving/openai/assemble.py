"""A non-streaming answer folded from a stream's chunks, keeping every field the rank sent:
the rank's ``id``, ``created``, ``model``, ``system_fingerprint`` (first value), each choice's text
or message, ``logprobs`` (lists joined), ``token_ids`` (joined), ``finish_reason`` and
``stop_reason`` (last value), and any other field as the rank last sent it; the fields vLLM's
non-streaming answer carries that a stream leaves out are there as null
(:data:`~balanceroute.serving.openai.responses.TOP_NULLS` and the others), in vLLM's order."""

from __future__ import annotations

from typing import Any

from balanceroute.serving.openai.responses import (
    CHAT_CHOICE_NULLS,
    CHAT_TAIL_NULLS,
    MESSAGE_NULLS,
    TAIL_NULLS,
    TEXT_CHOICE_NULLS,
    TOP_NULLS,
    usage,
    whole_usage,
)

SKIP_TOP = {"choices", "usage", "object"}


def _join(old: Any, new: Any) -> Any:
    """Two pieces of one field: strings and lists joined, dicts joined key by key, else the new."""
    if old is None:
        return new
    if new is None:
        return old
    if isinstance(old, str) and isinstance(new, str):
        return old + new
    if isinstance(old, list) and isinstance(new, list):
        return old + new
    if isinstance(old, dict) and isinstance(new, dict):
        out = dict(old)
        for k, v in new.items():
            out[k] = _join(out.get(k), v)
        return out
    return new


def _join_tool_calls(old: list[dict[str, Any]], new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tool-call deltas joined by their ``index`` (arguments arrive in pieces)."""
    out = [dict(c) for c in old]
    for call in new:
        i = call.get("index", len(out))
        match = next((c for c in out if c.get("index", -1) == i), None)
        if match is None:
            out.append(dict(call))
            continue
        for k, v in call.items():
            match[k] = (
                v if k in ("index", "id", "type") and v is not None else _join(match.get(k), v)
            )
    return out


class Assembler:
    """Folds parsed chunks (:meth:`add`) into the whole answer (:meth:`answer`)."""

    def __init__(self, chat: bool) -> None:
        self.chat = chat
        self.top: dict[str, Any] = {}
        self.choices: dict[int, dict[str, Any]] = {}
        self.usage: dict[str, Any] | None = None

    def add(self, obj: dict[str, Any]) -> None:
        """One chunk."""
        for k, v in obj.items():
            if k not in SKIP_TOP and self.top.get(k) is None:
                self.top[k] = v
        if obj.get("usage"):
            self.usage = obj["usage"]
        for choice in obj.get("choices") or []:
            self._choice(choice)

    def _choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index", 0))
        into = self.choices.setdefault(index, {"index": index})
        for k, v in choice.items():
            if k == "index":
                continue
            if k == "delta":
                self._delta(into, v or {})
            elif k in ("text", "logprobs", "token_ids"):
                into[k] = _join(into.get(k), v)
            elif v is not None or k not in into:
                into[k] = v

    def _delta(self, into: dict[str, Any], delta: dict[str, Any]) -> None:
        message = into.setdefault("message", {"role": "assistant", "content": None})
        for k, v in delta.items():
            if k == "role":
                message["role"] = v or message["role"]
            elif k == "tool_calls":
                message[k] = _join_tool_calls(message.get(k) or [], v or [])
            else:
                message[k] = _join(message.get(k), v)

    def answer(self, prompt: int, completion: int, rid: str, created: int) -> dict[str, Any]:
        """The non-streaming answer (``rid``, ``created``: when the rank sent none)."""
        out: dict[str, Any] = {"id": self.top.get("id") or rid,
                               "object": "chat.completion" if self.chat else "text_completion",
                               "created": self.top.get("created") or created,
                               "model": self.top.get("model")}  # fmt: skip
        out["choices"] = [self._whole_choice(self.choices[i]) for i in sorted(self.choices)]
        out.update({k: self.top.get(k) for k in TOP_NULLS})
        out["usage"] = whole_usage(self.usage if self.usage else usage(prompt, completion))
        for k, v in {**(CHAT_TAIL_NULLS if self.chat else TAIL_NULLS), **self.top}.items():
            out.setdefault(k, v)
        return out

    def _whole_choice(self, choice: dict[str, Any]) -> dict[str, Any]:
        out: dict[str, Any] = {"index": choice["index"]}
        if self.chat:
            message = choice.get("message") or {"role": "assistant", "content": None}
            if message.get("content") is None and not message.get("tool_calls"):
                message["content"] = ""
            out["message"] = {**message, **{k: v for k, v in MESSAGE_NULLS.items()
                                            if k not in message}}  # fmt: skip
        else:
            out["text"] = choice.get("text") or ""
        nulls = CHAT_CHOICE_NULLS if self.chat else TEXT_CHOICE_NULLS
        for k, v in {**nulls, **choice}.items():
            if k not in ("index", "message", "text"):
                out[k] = v
        return out

"""vLLM's error body and what the official openai client makes of an error answer."""

from __future__ import annotations

from typing import Any

import httpx
import openai

ERROR_KEYS = {"message", "type", "param", "code"}


def error_of(resp: httpx.Response) -> dict[str, Any]:
    """The ``error`` object of a vLLM-shaped error body; AssertionError naming what was sent."""
    try:
        data = resp.json()
    except ValueError:
        raise AssertionError(f"{resp.status_code}: not JSON: {resp.text[:200]!r}") from None
    err = data.get("error") if isinstance(data, dict) else None
    assert isinstance(err, dict), f"{resp.status_code}: no error object: {resp.text[:300]}"
    assert set(err) >= ERROR_KEYS, (
        f"{resp.status_code}: error keys {sorted(err)}: {resp.text[:300]}"
    )
    assert isinstance(err["message"], str) and err["message"], f"empty message: {resp.text[:300]}"
    return err


def client(base_url: str, api_key: str = "none") -> openai.OpenAI:
    """The official client for ``base_url`` (no retries, short timeout)."""
    return openai.OpenAI(base_url=base_url + "/v1", api_key=api_key, max_retries=0, timeout=60.0)


def raised(call: Any) -> openai.APIStatusError:
    """The APIStatusError that ``call()`` raises (AssertionError if it returns or raises another)."""
    try:
        call()
    except openai.APIStatusError as exc:
        return exc
    raise AssertionError("the call succeeded; an error was expected")

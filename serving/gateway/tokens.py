"""Prompt tokens and prompt keys of live requests.

With a Hugging Face ``tokenizer.json`` (``--tokenizer FILE``, loaded from that local file by the
``tokenizers`` package) a text prompt's count is exact for completions (chat templates add a few
tokens the count does not see); a token-id prompt is exact without one; otherwise the count is
the emulator's documented estimate, whitespace words
(:func:`balanceroute.features.prompts.count_tokens`). Either way the rank's own
``usage.prompt_tokens`` replaces the count when it arrives. The prompt key is the one
definition of :mod:`balanceroute.features.prompts` (the first 16 whitespace words, or ids),
hashed as trace keys are (:func:`balanceroute.features.schema.hash_keys`, one key at a time).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from balanceroute.features.errors import UserError
from balanceroute.features.prompts import count_tokens, prompt_key_of
from balanceroute.features.schema import hash_key


class PromptCounter:
    """Counts prompt tokens: exactly with a tokenizer or for token ids, else an estimate."""

    def __init__(self, tokenizer_file: str | Path | None = None) -> None:
        self.tokenizer = None
        if tokenizer_file is not None:
            from tokenizers import Tokenizer

            path = Path(tokenizer_file)
            if not path.is_file():
                raise UserError(f"--tokenizer '{path}': no such file")
            try:
                self.tokenizer = Tokenizer.from_file(str(path))
            except Exception as exc:  # the Rust library raises plain Exceptions
                raise UserError(f"--tokenizer '{path}' is not a tokenizer.json: {exc}") from None

    def count(self, prompt: str | Sequence[int]) -> tuple[int, bool]:
        """``(tokens, exact)`` of one prompt."""
        if not isinstance(prompt, str):
            return len(prompt), True
        if self.tokenizer is not None:
            return len(self.tokenizer.encode(prompt).ids), True
        return count_tokens(prompt), False


def prompt_key(prompt: str | Sequence[int]) -> tuple[str, int]:
    """The live prompt key and its 64-bit hash (never 0 for a key)."""
    key = prompt_key_of(prompt)
    return key, hash_key(key)

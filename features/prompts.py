"""Live prompts from trace rows, and back: the one definition the bench and the gateway share.

A trace row has a prompt length and, optionally, a prompt key. :func:`build_prompt` turns it
into a prompt of exactly ``n`` whitespace tokens whose first ``min(n, PROMPT_KEY_TOKENS)`` tokens
are a deterministic function of the key (same key, same prefix; no key, one fixed filler
prefix); :func:`build_prompt_ids` does the same with token ids. A proxy recovers the key of a
live prompt with :func:`prompt_key_of`: its first ``PROMPT_KEY_TOKENS`` tokens joined by one
space, so requests of one trace key share one live key.

The emulator's tokenizer is :func:`count_tokens`: a text prompt counts its whitespace-separated
words, a token-id list counts its ids. Real engines tokenize text differently (send ids to get
exact prompt lengths there). A gateway counts a live prompt with :class:`PromptCounter`: with a
Hugging Face ``tokenizer.json`` (``--tokenizer FILE``, loaded from that local file by the
``tokenizers`` package) a text prompt's count is exact for completions (chat templates add a few
tokens it does not see), a token-id prompt's is exact without one, and otherwise the count is
:func:`count_tokens`' estimate; the rank's own ``usage.prompt_tokens`` replaces it when it
arrives. :func:`prompt_key` gives the live key and its hash, as trace keys are hashed
(:func:`~balanceroute.features.schema.hash_key`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from balanceroute.features.errors import UserError
from balanceroute.features.schema import hash_key

PROMPT_KEY_TOKENS = 16
# a key word is cut to this many characters: a client's prompt cannot make its key, which
# crosses processes and lands in the completion log, longer than 16 x 65 characters
KEY_WORD_CHARS = 64
# count_tokens' byte map: the ASCII characters str.split() splits on to b" ", the rest to b"x"
_WORD_MARKS = bytes(32 if chr(b).isspace() else 120 for b in range(128)) + b"x" * 128

# 64 short common words (6 bits a token): a key prefix of 16 words carries 96 bits of the key's
# hash. The filler word is not among them, so a keyed prefix never equals the keyless one.
KEY_WORDS: tuple[str, ...] = (
    "time", "year", "people", "way", "day", "man", "thing", "woman",
    "life", "child", "world", "school", "state", "family", "student", "group",
    "country", "problem", "hand", "part", "place", "case", "week", "company",
    "system", "program", "question", "work", "government", "number", "night", "point",
    "home", "water", "room", "mother", "area", "money", "story", "fact",
    "month", "lot", "right", "study", "book", "eye", "job", "word",
    "business", "issue", "side", "kind", "head", "house", "service", "friend",
    "father", "power", "hour", "game", "line", "end", "member", "law",
)  # fmt: skip
FILLER_WORD = "hello"
# Token ids: key ids are drawn from [KEY_ID_BASE, KEY_ID_BASE + 4096), away from the special
# tokens at the start of common vocabularies; the filler id is one ordinary token.
KEY_ID_BASE = 1000
FILLER_ID = 9707


def _key_digest(key: str) -> bytes:
    """32 stable bytes of a prompt key (identical across processes and machines)."""
    return hashlib.blake2b(key.encode("utf-8"), digest_size=32).digest()


def key_prefix_words(key: str | None) -> list[str]:
    """The ``PROMPT_KEY_TOKENS`` words a prompt of this key starts with."""
    if key is None:
        return [FILLER_WORD] * PROMPT_KEY_TOKENS
    digest = _key_digest(key)
    return [KEY_WORDS[b & 63] for b in digest[:PROMPT_KEY_TOKENS]]


def key_prefix_ids(key: str | None) -> list[int]:
    """The ``PROMPT_KEY_TOKENS`` token ids a prompt of this key starts with."""
    if key is None:
        return [FILLER_ID] * PROMPT_KEY_TOKENS
    digest = _key_digest(key)
    return [
        KEY_ID_BASE + (int.from_bytes(digest[2 * i : 2 * i + 2], "little") & 4095)
        for i in range(PROMPT_KEY_TOKENS)
    ]


def _check_length(n_tokens: int) -> None:
    if n_tokens < 1:
        raise ValueError(f"a prompt needs at least one token, got {n_tokens}")


def build_prompt(n_tokens: int, prompt_key: str | None = None) -> str:
    """A text prompt of exactly ``n_tokens`` whitespace words, its prefix set by the key."""
    _check_length(n_tokens)
    head = key_prefix_words(prompt_key)[:n_tokens]
    rest = n_tokens - len(head)
    return " ".join(head) + (" " + FILLER_WORD) * rest


def build_prompt_ids(n_tokens: int, prompt_key: str | None = None) -> list[int]:
    """A token-id prompt of exactly ``n_tokens`` ids, its prefix set by the key."""
    _check_length(n_tokens)
    head = key_prefix_ids(prompt_key)[:n_tokens]
    return head + [FILLER_ID] * (n_tokens - len(head))


def prompt_key_of(prompt: str | Sequence[int]) -> str:
    """The live prompt key: the first ``PROMPT_KEY_TOKENS`` tokens joined by one space (each word
    cut to ``KEY_WORD_CHARS`` characters)."""
    if isinstance(prompt, str):
        words = prompt.split(None, PROMPT_KEY_TOKENS)[:PROMPT_KEY_TOKENS]
        return " ".join(w[:KEY_WORD_CHARS] for w in words)
    return " ".join(str(int(t)) for t in prompt[:PROMPT_KEY_TOKENS])


def count_tokens(prompt: str | Sequence[int]) -> int:
    """The emulator's tokenizer: whitespace words of a text (``len(prompt.split())``), or the
    number of token ids. An ASCII text's words are counted without splitting it (a gateway
    counts every prompt: 3 us for 1,000 words where splitting takes 20 us)."""
    if not isinstance(prompt, str):
        return len(prompt)
    if not prompt.isascii():
        return len(prompt.split())
    marks = prompt.encode("ascii").translate(_WORD_MARKS)  # whitespace to b" ", the rest b"x"
    return marks.count(b" x") + (marks[:1] == b"x")


def chat_text(messages: Sequence[object]) -> str:
    """The prompt text of chat messages (dicts as posted): every message's text content, in
    order, joined by one space (text parts of a multi-part content count, other parts not)."""
    texts: list[str] = []
    for m in messages:
        content = m.get("content") if isinstance(m, dict) else None
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts.extend(
                p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)
            )
    return " ".join(texts)


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

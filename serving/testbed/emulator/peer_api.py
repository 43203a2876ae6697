"""What the peer routers ask an engine for, so their load-aware policies are not blind here.

``sglang-router`` reads ``GET /server_info`` (falling back to ``/get_server_info``) and
``/model_info`` (``/get_model_info``) when it registers a worker: the model is
``served_model_name`` (else ``model_path``), or ``unknown`` when both fail. Its ``power_of_two``
polls ``GET /get_load``, SGLang's list with one entry per DP rank
(``dp_rank, num_reqs, num_waiting_reqs, num_tokens``), and sums ``num_tokens``.
``vllm-router``'s ``power_of_two`` polls the same path but reads an object's integer ``load``
(no released vLLM serves ``/get_load``); ``EmulatorConfig.get_load`` picks the shape. Its
``cache_aware`` and ``kv_aware`` tokenize each prompt with ``POST /v1/completions/render``: vLLM
answers a list with one entry per prompt (``request_id``, ``token_ids``, ``sampling_params``,
``model``). The emulator's token ids are :func:`word_ids` of its whitespace words, so one word
is one id and a shared prompt prefix is a shared id prefix.
"""

from __future__ import annotations

import hashlib
from typing import Any

import orjson
from fastapi import FastAPI, Request
from starlette.responses import Response

from balanceroute.features.prompts import FILLER_ID, FILLER_WORD, KEY_ID_BASE, KEY_WORDS
from balanceroute.serving.openai.requests import CompletionRequest, prompt_batch
from balanceroute.serving.testbed.emulator.group import DecodeGroup

JSON_TYPE = "application/json"
VERSION = "balanceroute-emulator"
VOCAB = 32_000
_KNOWN = {w: KEY_ID_BASE + i for i, w in enumerate(KEY_WORDS)} | {FILLER_WORD: FILLER_ID}


def word_id(word: str) -> int:
    """The emulator's id of one whitespace word: the prompt builder's words keep fixed ids, any
    other word a stable hash below ``VOCAB``."""
    known = _KNOWN.get(word)
    if known is not None:
        return known
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=4).digest()) % VOCAB


def word_ids(prompt: str | list[int]) -> list[int]:
    """Token ids of a prompt as the emulator counts it (ids given stay as they are)."""
    if isinstance(prompt, str):
        return [word_id(w) for w in prompt.split()]
    return list(prompt)


def server_info(group: DecodeGroup, rank: int) -> dict[str, Any]:
    """SGLang's ``/get_server_info`` fields a router reads (server args, scheduler info)."""
    cfg = group.config
    return {
        "model_path": cfg.model,
        "tokenizer_path": None,
        "served_model_name": cfg.model,
        "host": cfg.host,
        "port": cfg.port_base + rank,
        "dp_size": 1,
        "tp_size": 1,
        "max_running_requests": cfg.slots,
        "context_length": cfg.max_model_len,
        "max_total_num_tokens": cfg.kv_capacity,
        "max_req_input_len": cfg.max_model_len - 1,
        "internal_states": [{"last_gen_throughput": 0.0}],
        "version": VERSION,
    }


def model_info(group: DecodeGroup) -> dict[str, Any]:
    """SGLang's ``/get_model_info``."""
    return {
        "model_path": group.config.model,
        "tokenizer_path": None,
        "is_generation": True,
        "preferred_sampling_params": None,
        "weight_version": "default",
        "has_image_understanding": False,
        "has_audio_understanding": False,
        "model_type": None,
        "architectures": None,
    }


def load_entry(group: DecodeGroup, rank: int) -> dict[str, int]:
    """One rank's load as SGLang reports a DP rank's: requests running and waiting, KV tokens."""
    state = group.rank_states[rank]
    return {
        "dp_rank": 0,
        "num_reqs": len(state.running) + len(state.waiting),
        "num_waiting_reqs": len(state.waiting),
        "num_tokens": int(state.load),
    }


def load_body(group: DecodeGroup, rank: int) -> Any:
    """``/get_load`` in the configured shape: SGLang's list, or ``{"load": requests}``."""
    entry = load_entry(group, rank)
    if group.config.get_load == "sglang":
        return [entry]
    return {"load": entry["num_reqs"]}


def render_body(body: CompletionRequest, request_id: str, model: str) -> list[dict[str, Any]]:
    """vLLM's ``/v1/completions/render``: one entry per prompt, its token ids and sampling."""
    sampling = {"max_tokens": body.max_tokens, "ignore_eos": body.ignore_eos}
    return [
        {
            "request_id": f"cmpl-{request_id}-{i}",
            "token_ids": word_ids(p),
            "sampling_params": sampling,
            "model": model,
        }
        for i, p in enumerate(prompt_batch(body.prompt))
    ]


def add_peer_routes(app: FastAPI, group: DecodeGroup, rank: int, check: Any) -> None:
    """Mount the peer-facing routes on rank ``rank``'s app; ``check`` refuses a request for
    another model as the completions endpoint does."""
    info = orjson.dumps(server_info(group, rank))
    minfo = orjson.dumps(model_info(group))

    async def get_server_info() -> Response:
        """SGLang's server information (``/server_info`` is its newer name)."""
        return Response(info, media_type=JSON_TYPE)

    async def get_model_info() -> Response:
        """SGLang's model information (``/model_info`` is its newer name)."""
        return Response(minfo, media_type=JSON_TYPE)

    for path in ("/get_server_info", "/server_info"):
        app.add_api_route(path, get_server_info, methods=["GET"])
    for path in ("/get_model_info", "/model_info"):
        app.add_api_route(path, get_model_info, methods=["GET"])

    @app.get("/get_load")
    async def get_load() -> Response:
        """This rank's load (the shape ``EmulatorConfig.get_load`` names)."""
        return Response(orjson.dumps(load_body(group, rank)), media_type=JSON_TYPE)

    @app.post("/v1/completions/render")
    async def render(body: CompletionRequest, request: Request) -> Response:
        """vLLM's prompt rendering: the token ids the emulator counts, nothing generated."""
        check(body)
        rid = request.headers.get("x-request-id") or body.request_id or "render"
        out = render_body(body, rid, group.config.model)
        return Response(orjson.dumps(out), media_type=JSON_TYPE)

"""What a client or a front router asks about the group (README, "Several groups"):
``GET /v1/models`` (the models the first rank in rotation lists), SGLang's ``GET /get_load``,
``/get_server_info`` and ``/get_model_info`` (and their newer names ``/server_info``,
``/model_info``), so a peer router in front of several groups balances them on their load and
registers their model by name. Each takes the gateway's bearer token when one is set (the
model calls reach the ranks with the upstream key: an open one would lend it to anyone).

A gateway's group is what SGLang calls data-parallel ranks, so ``/get_load`` answers SGLang's
list with one entry per rank (``dp_rank``, ``num_reqs``, ``num_waiting_reqs``, ``num_tokens``):
the requests the gateway holds in flight on the rank and its KV tokens (prompt plus tokens
streamed), with the requests waiting in the gateway's pool spread evenly over the entries (their
prompt tokens too), since none is on a rank yet. ``sglang-router``'s ``power_of_two`` sums the
entries' ``num_tokens``. With ``--get-load load`` the answer is ``{"load": n}`` instead (``n``:
the group's requests in flight and waiting), the integer ``vllm-router``'s ``power_of_two`` reads.
The model name is the first model a rank in rotation lists (``/v1/models``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
from fastapi import APIRouter, Request, Response

from balanceroute.serving.gateway.runtime import Gateway
from balanceroute.serving.http.auth import Authorized
from balanceroute.serving.openai.responses import error_body

router = APIRouter(tags=["group"])
JSON = "application/json"


async def listed_models(gw: Gateway) -> bytes | None:
    """``/v1/models`` of the first rank in rotation that answers it (None: none does)."""
    for g in range(gw.group.ranks):
        if not gw.group.healthy[g]:
            continue
        try:
            status, content = await gw.probes.get(g, "/v1/models", gw.upstream_headers(g, "models"),
                                                  gw.settings.connect_timeout_s)  # fmt: skip
        except (OSError, TimeoutError):
            continue
        if status == 200:
            return content
    return None


@router.get("/v1/models", dependencies=[Authorized])
async def models(request: Request) -> Response:
    """The models the first rank in rotation lists (503 when none is)."""
    content = await listed_models(request.app.state.gateway)
    if content is not None:
        return Response(content, 200, media_type=JSON)
    return Response(error_body(503, "no rank in rotation answers /v1/models"), 503, media_type=JSON)


def load_entries(gw: Gateway) -> list[dict[str, int]]:
    """SGLang's ``/get_load`` list for the gateway's group: one entry per rank."""
    group = gw.group
    loads = group.loads()
    waiting = np.fromiter(group.pool.order, dtype=np.int64, count=group.pool.size)
    ranks = group.ranks
    share, extra = divmod(int(waiting.size), ranks)
    waiting_tokens = int(group.table.prompt_tokens[waiting].sum()) if waiting.size else 0
    tokens_share, tokens_extra = divmod(waiting_tokens, ranks)
    return [
        {
            "dp_rank": g,
            "num_reqs": int(group.inflight[g]) + share + (g < extra),
            "num_waiting_reqs": share + (g < extra),
            "num_tokens": int(loads[g]) + tokens_share + (g < tokens_extra),
        }
        for g in range(ranks)
    ]


@router.get("/get_load", dependencies=[Authorized])
async def get_load(request: Request) -> Response:
    """The group's load in the shape ``--get-load`` names (SGLang's list by default)."""
    gw: Gateway = request.app.state.gateway
    entries = load_entries(gw)
    body: Any = entries
    if gw.settings.get_load == "load":
        body = {"load": sum(e["num_reqs"] for e in entries)}
    return Response(orjson.dumps(body), media_type=JSON)


async def model_name(gw: Gateway) -> str | None:
    """The first model a rank in rotation lists, None when no rank answers."""
    content = await listed_models(gw)
    try:
        return None if content is None else str(orjson.loads(content)["data"][0]["id"])
    except (ValueError, KeyError, IndexError, TypeError):
        return None


async def _named(request: Request) -> tuple[Gateway, str] | Response:
    gw: Gateway = request.app.state.gateway
    name = await model_name(gw)
    if name is None:
        return Response(
            error_body(503, "no rank in rotation names its model"), 503, media_type=JSON
        )
    return gw, name


@router.get("/get_server_info", dependencies=[Authorized])
@router.get("/server_info", dependencies=[Authorized])
async def server_info(request: Request) -> Response:
    """SGLang's server information: the model's name and the group's shape."""
    named = await _named(request)
    if isinstance(named, Response):
        return named
    gw, name = named
    group = gw.group
    body = {
        "model_path": name,
        "served_model_name": name,
        "tokenizer_path": None,
        "dp_size": group.ranks,
        "tp_size": 1,
        "max_running_requests": group.ranks * group.slots,
        "internal_states": [{"last_gen_throughput": 0.0}],
        "version": "balanceroute-gateway",
    }
    return Response(orjson.dumps(body), media_type=JSON)


@router.get("/get_model_info", dependencies=[Authorized])
@router.get("/model_info", dependencies=[Authorized])
async def model_info(request: Request) -> Response:
    """SGLang's model information: the model's name."""
    named = await _named(request)
    if isinstance(named, Response):
        return named
    _, name = named
    body = {"model_path": name, "tokenizer_path": None, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": "default"}  # fmt: skip
    return Response(orjson.dumps(body), media_type=JSON)

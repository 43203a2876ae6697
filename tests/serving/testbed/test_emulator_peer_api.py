"""What the peer routers ask an engine for, on a real emulator: the shapes their parsers read.

The parsers, from the routers' sources: ``sglang-router`` deserializes ``/server_info`` (falling
back to ``/get_server_info``) into optional typed fields and takes ``served_model_name`` (else
``model_path``) as the model; ``/model_info`` likewise (``model_type``, ``architectures``); its
``power_of_two`` wants ``/get_load`` as a JSON list and sums each entry's integer ``num_tokens``.
``vllm-router``'s ``power_of_two`` reads an integer ``load`` from an object; its ``cache_aware``
and ``kv_aware`` post the request to ``/v1/completions/render`` and read ``token_ids``.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st

from balanceroute.features.errors import UserError
from balanceroute.features.prompts import build_prompt, count_tokens
from balanceroute.serving.testbed.emulator.config import EmulatorConfig
from balanceroute.serving.testbed.emulator.group import DecodeGroup
from balanceroute.serving.testbed.emulator.peer_api import load_body, word_ids
from tests.serving.testbed.helpers import Emulator

# sglang-router's ServerInfo and ModelInfo: every field optional, each of one JSON type.
SERVER_INFO = {"model_path": str, "served_model_name": str, "dp_size": int, "version": str,
               "max_total_tokens": int, "max_prefill_tokens": int, "max_running_requests": int,
               "max_num_reqs": int, "max_batch_size": int}  # fmt: skip
MODEL_INFO = {"model_path": str, "tokenizer_path": str, "is_generation": bool, "model_type": str,
              "architectures": list}  # fmt: skip


@pytest.fixture(scope="module")
def emu(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Emulator]:
    """Two ranks of two slots at real time (iterations of about 40 ms)."""
    out = tmp_path_factory.mktemp("emu-peers") / "emulator.out"
    server = Emulator(out, ranks=2, slots=2, time_scale=1.0, model="peer-model")
    yield server
    server.stop()


def parses_as(body: dict[str, Any], fields: dict[str, type]) -> None:
    """Each field the router reads is absent, null or of the type it deserializes into."""
    for name, kind in fields.items():
        value = body.get(name)
        assert value is None or isinstance(value, kind), (name, value)


@pytest.mark.server
@pytest.mark.parametrize("path", ["/get_server_info", "/server_info"])
def test_server_info_names_the_served_model(emu: Emulator, path: str):
    r = httpx.get(emu.urls[1] + path)
    assert r.status_code == 200
    body = r.json()
    parses_as(body, SERVER_INFO)
    assert body["served_model_name"] == body["model_path"] == "peer-model"
    assert body["dp_size"] == 1 and body["max_running_requests"] == 2
    assert body["port"] == emu.config.port_base + 1


@pytest.mark.server
@pytest.mark.parametrize("path", ["/get_model_info", "/model_info"])
def test_model_info(emu: Emulator, path: str):
    body = httpx.get(emu.urls[0] + path).json()
    parses_as(body, MODEL_INFO)
    assert body["model_path"] == "peer-model" and body["is_generation"] is True


@pytest.mark.server
def test_get_load_is_sglangs_list_and_counts_a_running_request(emu: Emulator):
    url = emu.urls[0]
    idle = httpx.get(url + "/get_load").json()
    assert isinstance(idle, list) and len(idle) == 1
    assert idle[0] == {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    body = {"prompt": build_prompt(50, "k"), "max_tokens": 100_000, "ignore_eos": True,
            "stream": True}  # fmt: skip
    with httpx.Client(timeout=30.0) as client:
        with client.stream("POST", url + "/v1/completions", json=body) as stream:
            lines = stream.iter_lines()  # kept: a collected iterator closes the stream
            next(line for line in lines if line.startswith("data"))
            busy = httpx.get(url + "/get_load").json()[0]
            other = httpx.get(emu.urls[1] + "/get_load").json()[0]
    assert busy["num_reqs"] == 1 and busy["num_waiting_reqs"] == 0
    assert isinstance(busy["num_tokens"], int) and busy["num_tokens"] >= 50
    assert other["num_reqs"] == 0 and other["num_tokens"] == 0


@pytest.mark.server
def test_get_load_counts_waiting_requests(emu: Emulator):
    url = emu.urls[1]  # two slots: the third request waits
    body = {"prompt": "a b", "max_tokens": 100_000, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(3) as pool, httpx.Client(timeout=30.0) as client:
        streams = [client.stream("POST", url + "/v1/completions", json=body) for _ in range(2)]
        opened = [s.__enter__() for s in streams]
        try:
            readers = [s.iter_lines() for s in opened]  # kept: a collected one closes its stream
            for lines in readers:
                next(line for line in lines if line.startswith("data"))
            waiter = pool.submit(httpx.post, url + "/v1/completions",
                                 json={"prompt": "c", "max_tokens": 2, "ignore_eos": True},
                                 timeout=30.0)  # fmt: skip
            deadline = time.monotonic() + 10
            load = httpx.get(url + "/get_load").json()[0]
            while load["num_waiting_reqs"] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
                load = httpx.get(url + "/get_load").json()[0]
            assert load["num_reqs"] == 3 and load["num_waiting_reqs"] == 1
        finally:
            for s in streams:
                s.__exit__(None, None, None)
        assert waiter.result(timeout=10).status_code == 200


@pytest.mark.server
def test_render_gives_one_id_per_emulator_token(emu: Emulator):
    accepted = emu.state()["accepted"]
    prompt = build_prompt(40, "shared")
    body = {"model": "peer-model", "prompt": prompt, "max_tokens": 7, "stream": True,
            "no_stop_trim": False, "return_hidden_states": False}  # fmt: skip
    r = httpx.post(emu.urls[0] + "/v1/completions/render", json=body)
    assert r.status_code == 200
    out = r.json()
    assert isinstance(out, list) and len(out) == 1
    entry = out[0]
    assert entry["model"] == "peer-model" and entry["request_id"].startswith("cmpl-")
    ids = entry["token_ids"]
    assert len(ids) == count_tokens(prompt) and all(isinstance(t, int) and t >= 0 for t in ids)
    assert entry["sampling_params"]["max_tokens"] == 7
    longer = httpx.post(emu.urls[1] + "/v1/completions/render",
                        json={"prompt": build_prompt(60, "shared")}).json()[0]["token_ids"]  # fmt: skip
    other = httpx.post(emu.urls[1] + "/v1/completions/render",
                       json={"prompt": build_prompt(40, "another")}).json()[0]["token_ids"]  # fmt: skip
    assert longer[:40] == ids and other[:16] != ids[:16]
    given_ids = httpx.post(emu.urls[0] + "/v1/completions/render",
                           json={"prompt": [5, 6, 7]}).json()[0]["token_ids"]  # fmt: skip
    assert given_ids == [5, 6, 7]
    assert emu.state()["accepted"] == accepted  # rendering starts no request


@pytest.mark.server
def test_render_refuses_what_completions_refuses(emu: Emulator):
    wrong = httpx.post(emu.urls[0] + "/v1/completions/render", json={"model": "x", "prompt": "a"})
    assert wrong.status_code == 404 and "x" in wrong.json()["error"]["message"]
    bad = httpx.post(emu.urls[0] + "/v1/completions/render", json={"prompt": 5})
    assert bad.status_code == 400 and bad.json()["error"]["type"] == "BadRequestError"


def test_get_load_shape_for_vllm_router():
    group = DecodeGroup(EmulatorConfig(ranks=2, slots=2, get_load="load"))
    assert load_body(group, 1) == {"load": 0}
    sglang = DecodeGroup(EmulatorConfig(ranks=2, slots=2))
    assert load_body(sglang, 0) == [
        {"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}
    ]


def test_unknown_get_load_shape_is_a_clear_error():
    with pytest.raises(UserError, match="--get-load must be one of sglang, load, got 'json'"):
        EmulatorConfig(get_load="json")


words = st.lists(st.text(alphabet="abcdefghij", min_size=1, max_size=6), max_size=30)


@given(words, words)
def test_word_ids_keep_prefixes_and_count(head: list[str], tail: list[str]):
    """A prompt's ids are its words' ids: one per emulator token, a shared prefix shared."""
    full = word_ids(" ".join(head + tail))
    assert len(full) == count_tokens(" ".join(head + tail)) == len(head) + len(tail)
    assert full[: len(head)] == word_ids(" ".join(head))

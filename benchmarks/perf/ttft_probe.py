"""Added time to first token per router, arms interleaved request by request, as JSON.

One emulated group (G = 8, B = 32, real time) and every arm's router in front of it at once;
one client sends short streaming completions one at a time, visiting the arms in turn (a new
random order each round), so every arm meets the same machine at the same moments and the
comparison is paired round by round. Per request: the client's time to the first token event
minus the engine's own arrival-to-first-chunk time (the emulator's request log), so the wait for
the engine's next iteration is not counted; per arm: its median, and over ``direct`` and over the
best peer (and, for ``gateway:ROUTER``, over ``base:ROUTER``) the median of the per-round
differences with a 95% bootstrap interval. It measures a lone request's path through each
router (nothing else streams); ``side_by_side.py`` measures it among the streams of a loaded
group.

Arms: ``direct`` (a rank straight), ``gateway:ROUTER`` for each ``--routers`` (the gateway's
default layout), ``base:ROUTER`` with ``--base-python`` (another installation's gateway), the
peers' ``round_robin`` (``sglang-router``, ``vllm-router`` from ``scripts/install_peers.sh``), and
with ``--floor`` the bare Python relay (``bare_relay.py``: what any Python relay pays here).

    .venv/bin/python benchmarks/perf/ttft_probe.py --rounds 300 > runs/ttft_probe.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from side_by_side import start_emulator, start_router  # this script's folder is on the path

from balanceroute.serving.testbed.emulator.config import DEFAULT_MODEL
from balanceroute.serving.testbed.emulator.iterlog import read_log
from balanceroute.serving.testbed.harness import ServerProcess

WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india")


def prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


class Client:
    """One kept-alive connection to an arm (opened again if the server closed it)."""

    def __init__(self, url: str) -> None:
        host, _, port = url.removeprefix("http://").partition(":")
        self.host, self.port = host, int(port)
        self.conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    async def first_token(self, body: bytes, rid: str) -> float:
        """Seconds from the request's first byte to the first token event; the answer is then
        read to its end."""
        if self.conn is None:
            self.conn = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.conn
        head = (f"POST /v1/completions HTTP/1.1\r\nhost: {self.host}:{self.port}\r\n"
                f"content-type: application/json\r\nx-request-id: {rid}\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()  # fmt: skip
        t0 = time.perf_counter()
        writer.write(head + body)
        seen = b""
        took = float("nan")
        while True:
            data = await reader.read(65536)
            if not data:
                writer.close()
                self.conn = None
                break
            seen += data
            if took != took and b'"text"' in seen:
                took = time.perf_counter() - t0
            if seen.endswith(b"\r\n0\r\n\r\n"):
                break
        return took


def paired(diff: np.ndarray, rng: np.random.Generator, n: int = 2000) -> list[float]:
    """The median of ``diff`` and its 95% bootstrap interval."""
    boots = np.median(rng.choice(diff, size=(n, diff.size)), axis=1)
    return [
        float(np.median(diff)),
        float(np.quantile(boots, 0.025)),
        float(np.quantile(boots, 0.975)),
    ]


async def probe(arms: dict[str, str], rounds: int, words: int, gap_s: float) -> dict[str, list]:
    rng = random.Random(7)
    sent: dict[str, list[tuple[str, float]]] = {a: [] for a in arms}
    clients = {a: Client(u) for a, u in arms.items()}
    names = list(arms)
    for r in range(rounds):
        rng.shuffle(names)
        for a in names:
            rid = f"probe-{r}-{a}"
            body = json.dumps({"model": DEFAULT_MODEL, "prompt": prompt(rng, words),
                               "max_tokens": 2, "stream": True}).encode()  # fmt: skip
            sent[a].append((rid, await clients[a].first_token(body, rid)))
            await asyncio.sleep(gap_s)
    return sent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=300)
    p.add_argument("--routers", default="count-jsq,brh")
    p.add_argument("--peers", default="sglang,vllm")
    p.add_argument(
        "--base-python", help="another installation's python: its gateway as base:ROUTER"
    )
    p.add_argument(
        "--words", type=int, default=600, help="prompt words (Azure-like: about 1,000 tokens)"
    )
    p.add_argument("--gap-s", type=float, default=0.02)
    p.add_argument("--floor", action="store_true", help="also the bare Python relay (bare_relay.py)")
    p.add_argument("--out", type=Path, default=Path("runs/ttft_probe"))
    p.add_argument("--peers-bin", type=Path,
                   default=Path.home() / ".cache/balanceroute/peers/venv-sglang-router-0.3.2-vllm-router-0.1.17/bin")  # fmt: skip
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    emu, urls = start_emulator(1.0, args.out / "emulator", args.out / "emulator.out", "sglang")
    procs: list[ServerProcess] = []
    arms = {"direct": urls[0]}
    load0 = os.getloadavg()
    try:
        kinds = [(f"gateway:{r}", "gateway-inproc", r) for r in args.routers.split(",") if r]
        if args.base_python:
            kinds += [(f"base:{r}", "base-gateway-inproc", r) for r in args.routers.split(",") if r]
        kinds += [(f"{k}-router:round_robin", k, "round_robin") for k in args.peers.split(",") if k]
        kinds += [("floor", "floor", "round_robin")] if args.floor else []
        for name, kind, policy in kinds:
            (args.out / name.replace(":", "_")).mkdir(exist_ok=True)
            proc, url = start_router(kind, policy, urls, args.out / name.replace(":", "_"),
                                     args.peers_bin, args.base_python)  # fmt: skip
            procs.append(proc)
            arms[name] = url
        sent = asyncio.run(probe(arms, args.rounds, args.words, args.gap_s))
    finally:
        for proc in procs:
            proc.terminate(60)
        emu.terminate(60)
    _, rq = read_log(args.out / "emulator")
    engine = dict(zip(rq["request_id"], rq["first_sent_s"] - rq["recv_s"], strict=True))
    outside = {
        a: np.array([(t - engine.get(rid, np.nan)) * 1e3 for rid, t in v]) for a, v in sent.items()
    }
    rng = np.random.default_rng(0)
    peers = [a for a in arms if a.endswith("-router:round_robin")]
    best = min(peers, key=lambda a: np.nanmedian(outside[a] - outside["direct"])) if peers else None
    result: dict[str, Any] = {"rounds": args.rounds, "words": args.words, "loadavg_before": load0,
                              "loadavg_after": os.getloadavg(), "best_peer": best, "arms": {}}  # fmt: skip
    for a, v in outside.items():
        ok = ~np.isnan(v) & ~np.isnan(outside["direct"])
        row = {"outside_p50_ms": float(np.nanmedian(v)), "failed": int(np.isnan(v).sum()),
               "added_ms": paired(v[ok] - outside["direct"][ok], rng)}  # fmt: skip
        if best is not None:
            okb = ~np.isnan(v) & ~np.isnan(outside[best])
            row["over_best_peer_ms"] = paired(v[okb] - outside[best][okb], rng)
        base = "base:" + a.partition(":")[2] if a.startswith("gateway:") else None
        if base in outside:
            okb = ~np.isnan(v) & ~np.isnan(outside[base])
            row["over_base_ms"] = paired(v[okb] - outside[base][okb], rng)
        result["arms"][a] = row
    json.dump(result, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()

"""Where the gateway's added time to first token goes, live, leg by leg, as JSON.

Each arm on a fresh emulated group (G = 8, B = 32, real time), ``balanceroute bench`` replaying
``--requests`` Azure requests at ``--load`` (``side_by_side.py``'s setup): ``direct`` and the
gateway as a user starts it with each of ``--routers``. Every process it starts loads
``legs_probe/sitecustomize.py``, which stamps each request with the one system-wide monotonic
clock: the client's send and first token (``bench``), the engine's receipt and first chunk (the
emulator's request log), and inside the gateway its first bytes, the body read, the body checked,
the decider called and returned (within it the pool, the records, the snapshot, the
policy's ``route``, the invariant check and the admission), the exchange made, the
forward written, the first token read and written. Per arm: the median (and quartiles) of every
leg in ms over the requests, and the added TTFT over ``direct`` as ``side_by_side.py`` counts it.

    .venv/bin/python benchmarks/perf/ttft_legs.py --routers brh,count-jsq > runs/legs.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd
from side_by_side import DATA, TRACE, one_arm, pin_router  # this script's folder is on the path

from balanceroute.serving.testbed.emulator.iterlog import read_log

PROBE = Path(__file__).with_name("legs_probe")
PEERS = Path.home() / ".cache" / "balanceroute" / "peers"
DIRECT_LEGS = [("client to engine", "send", "recv"), ("engine to client", "first", "client")]
GATEWAY_LEGS = [
    ("client to gateway", "send", "in"),
    ("read the request", "in", "body"),
    ("check the body", "body", "checked"),
    ("count, key and id", "checked", "admit"),
    ("decide", "admit", "decided"),
    ("  of which the policy", "route", "routed"),
    ("  of which into the pool", "admit", "pooled"),
    ("  the request's records", "pooled", "deciding"),
    ("  the snapshot", "deciding", "snapshot"),
    ("  the snapshot to the policy", "snapshot", "route"),
    ("  the invariant check", "routed", "checked_adm"),
    ("  the admission", "checked_adm", "resolved"),
    ("  back to the front", "resolved", "decided"),
    ("make the exchange", "decided", "exchange"),
    ("write the forward", "exchange", "forward"),
    ("gateway to engine", "forward", "recv"),
    ("engine to gateway", "first", "token_in"),
    ("relay the first token", "token_in", "token_out"),
    ("gateway to client", "token_out", "client"),
]


def stamps(folder: Path) -> pd.DataFrame:
    """Per request, every stamp of the arm in ``folder`` (seconds on the monotonic clock)."""
    t0 = {role: json.loads(next(folder.glob(f"{role}-*.json")).read_text())["t0"]
          for role in ("bench", "emulator")}  # fmt: skip
    client = pd.read_parquet(folder / "bench" / "requests.parquet").set_index("request_id")
    _, engine = read_log(folder / "emulator")
    engine = engine.drop_duplicates("request_id", keep=False).set_index("request_id")
    out = pd.DataFrame({"send": client["start_s"] + t0["bench"]})
    out["client"] = out["send"] + client["ttft_s"]
    out["recv"] = engine["recv_s"] + t0["emulator"]
    out["first"] = engine["first_sent_s"] + t0["emulator"]
    gateway = list(folder.glob("gateway-*.json"))
    if gateway:
        inside = pd.DataFrame(json.loads(gateway[0].read_text())).T.apply(pd.to_numeric)
        out = out.join(inside)
    return out.dropna(subset=["recv", "client"])


def legs(df: pd.DataFrame, which: list[tuple[str, str, str]]) -> dict[str, dict[str, float]]:
    out = {}
    for name, a, b in which:
        if a in df and b in df:
            ms = ((df[b] - df[a]) * 1e3).dropna().to_numpy()
            q = np.percentile(ms, [25, 50, 75]) if ms.size else [float("nan")] * 3
            out[name] = {"p25": round(q[0], 3), "p50": round(q[1], 3), "p75": round(q[2], 3)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--routers", default="brh,count-jsq")
    p.add_argument("--requests", type=int, default=150)
    p.add_argument("--load", type=float, default=0.2)
    p.add_argument("--trace", type=Path, default=DATA / TRACE)
    p.add_argument(
        "--out", type=Path, default=None, help="folder for the arms' logs (default: temporary)"
    )
    p.add_argument(
        "--pin",
        action="store_true",
        help="the router alone on the last CPU (as side_by_side.py --pin)",
    )
    args = p.parse_args()
    if args.pin:
        pin_router()
    root = args.out or Path(tempfile.mkdtemp(prefix="ttft_legs_"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(PROBE), os.environ.get("PYTHONPATH")])
    )
    arms = [("direct", None)] + [("gateway-plain", r) for r in args.routers.split(",") if r]
    result, direct = {}, None
    for i, (kind, router) in enumerate(arms):
        name = "direct" if router is None else f"gateway:{router}"
        folder = root / f"{i}-{'direct' if router is None else 'gw-' + router}"
        folder.mkdir(parents=True, exist_ok=True)
        os.environ["BR_LEGS_DIR"] = str(folder)
        run = one_arm(kind, router, args.trace, args.requests, args.load, 1.0, folder, PEERS)
        df = stamps(folder)
        row = {"outside_engine_ms_p50": run["outside_engine_ms_p50"],
               "legs_ms": legs(df, DIRECT_LEGS if router is None else GATEWAY_LEGS),
               "requests": len(df), "loadavg_before": run["loadavg_before"]}  # fmt: skip
        if router is None:
            direct = run["outside_engine_ms_p50"]
        elif direct is not None:
            row["added_over_direct_ms"] = round(run["outside_engine_ms_p50"] - direct, 3)
        result[name] = row
        print(f"{name}: {row.get('added_over_direct_ms', '')}", file=sys.stderr)
    print(json.dumps({"load": args.load, "requests": args.requests, "arms": result}, indent=1))


if __name__ == "__main__":
    main()

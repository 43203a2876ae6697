"""``balanceroute real-group``: the routers A/B'd on a running lockstep vLLM group."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from balanceroute.cli.options import positive_float, positive_int
from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.errors import UserError
from balanceroute.features.loaders import load_trace
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.model_store import save_estimator
from balanceroute.router.lab.cost import CostModel, resolve_cost, write_cost_file
from balanceroute.router.lab.cost_fit import fit_cost
from balanceroute.router.lab.prefill import PrefillConfig
from balanceroute.router.lab.replay_spec import ReplaySpec
from balanceroute.router.lab.runner import replay
from balanceroute.router.lab.simulator import SimResult
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.testbed.realgroup.ab import (
    DEFAULT_ARMS,
    FULL_SHARE,
    IDLE_S,
    GroupSpec,
    RealAb,
    attach_engine,
    engine_info,
    engine_ready,
    fidelity,
    group_lockstep,
    occupancy,
    run_study,
    summarize,
)
from balanceroute.serving.testbed.realgroup.steplog import read_steps
from balanceroute.serving.testbed.realgroup.workload import SliceSpec, write_slices


def register(sub: argparse._SubParsersAction) -> None:
    """Add the ``real-group`` subcommand."""
    p = sub.add_parser(
        "real-group",
        help="A/B the routers through the gateway on a running lockstep vLLM group",
        description="Every arm serves the same slices of a trace (prompts scaled to the "
        "engine's context, all arriving at once) through its own gateway in front of a "
        "data-parallel MoE vLLM server started with the balanceroute-vllm plugin and "
        "BALANCEROUTE_STEP_LOG; the engine's figures come from its step logs. Prints one JSON "
        "object as its last line: each arm's paired ratios to the first arm, with 95%% "
        "intervals over the repeats. scripts/real_group.sh starts the engine and runs this.",
    )
    p.add_argument("--engine", required=True, help="the vLLM server's base URL")
    p.add_argument("--ranks", type=positive_int, required=True, help="G: data-parallel size")
    p.add_argument("--slots", type=positive_int, required=True, help="B: --max-num-seqs")
    p.add_argument("--step-log", type=Path, required=True, help="BALANCEROUTE_STEP_LOG folder")
    p.add_argument("--trace", help="trace file the slices come from (required to run)")
    p.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help="router specs, the reference first (default %(default)s)")  # fmt: skip
    p.add_argument("--repeats", type=positive_int, default=5, help="paired repeats (5)")
    p.add_argument("--requests", type=positive_int, default=96,
                   help="requests per repeat (96: at G = 2, B = 8 the pool holds requests for "
                   "most of a run)")  # fmt: skip
    p.add_argument("--skip", type=int, default=2000,
                   help="trace requests before the first slice, the learned arm's training "
                   "history (2000)")  # fmt: skip
    p.add_argument("--learned", default="gbdt",
                   help="estimator fitted on the skipped requests for a brh:KIND arm; 'none' "
                   "for no learned arm (gbdt)")  # fmt: skip
    p.add_argument("--prompt-scale", type=positive_float, default=0.25,
                   help="prompt lengths x this (0.25)")  # fmt: skip
    p.add_argument("--output-scale", type=positive_float, default=0.25,
                   help="output lengths x this (0.25: a run takes about 25 s on a 2-core CPU)")  # fmt: skip
    p.add_argument("--max-model-len", type=positive_int, default=8192, help="engine context")
    p.add_argument("--model", help="model name (default: the first /v1/models lists)")
    p.add_argument("--gateway-flag", action="append", default=[], dest="gateway_flags",
                   help="extra gateway flag, repeatable (e.g. --gateway-flag=--tick=5ms)")  # fmt: skip
    p.add_argument("--sim-cost", default="fit",
                   help="cost model of the simulator's replay of the same study: 'fit' (default) "
                   "fits it to this run's step logs and writes cost.json; or a preset or cost "
                   "file")  # fmt: skip
    p.add_argument("--seed", type=int, default=0, help="seed of the arm orders (0)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--emulated", type=Path,
                   help="the --out of the same study run on the calibrated emulator: its ratios "
                   "become the headline's emulated ones (default: the simulator's)")  # fmt: skip
    p.add_argument("--remeasure", action="store_true",
                   help="run nothing: re-measure the study already in --out (its records.json "
                   "and slices) from the step logs")  # fmt: skip
    p.set_defaults(func=run)


def fit_learned(kind: str, out: Path) -> Path:
    """The learned arm's estimator fitted on the slices' history, saved beside them."""
    history = load_trace(out / "slices" / "history.csv")
    estimator = build_estimator(EstimatorSpec.parse(kind), history=history, horizon=DEFAULT_HORIZON)
    return save_estimator(estimator, out / f"model-{kind}.joblib")


def simulated(slices: list[Path], arms: tuple[str, ...], ranks: int, slots: int,
              cost: CostModel) -> list[dict]:  # fmt: skip
    """The same study replayed on the simulator with ``cost``: each run's imbalance (the same
    step-weighted ``G max - sum``) and throughput, shaped like the real records."""
    records = []
    for r, path in enumerate(slices):
        frame = load_trace(path)
        for arm in arms:
            router = RouterSpec.parse(arm)
            spec = ReplaySpec(router=router, workers=ranks, slots=slots, cost=cost,
                              prefill=PrefillConfig(saturate=True))  # fmt: skip
            estimator = None
            if router.estimator is not None:
                estimator = build_estimator(router.estimator, replay=frame,
                                            horizon=DEFAULT_HORIZON)  # fmt: skip
            result, _ = replay(frame, spec, estimator=estimator)
            records.append({"arm": arm, "repeat": r, "engine": sim_figures(result)})
    return records


def sim_figures(result: SimResult) -> dict[str, float]:
    """A replay's imbalance and throughput, whole-run and over the iterations up to the last
    admission (the window :func:`measure` calls saturated on the engine)."""
    last = int(result.admit_iter.max())
    first = result.admit_iter + (0 if result.prefill_steps is None else result.prefill_steps)
    produced = np.clip(np.minimum(first + result.output_tokens, last + 1) - first, 0, None)
    window_s = float(result.t_start[last + 1] - result.t_start[0])
    return {"imbalance_tokens": float(result.imbalance.mean()),
            "throughput_tok_s": float(result.output_tokens.sum()) / float(result.t_start[-1]),
            "saturated_imbalance_tokens": float(result.imbalance[: last + 1].mean()),
            "saturated_throughput_tok_s": float(produced.sum()) / window_s}  # fmt: skip


def sim_cost(name: str, step_log: Path, out: Path) -> CostModel:
    """The simulator's cost: fitted to the run's step logs (written to ``out/cost.json``) or
    what ``--cost`` accepts."""
    if name != "fit":
        return resolve_cost(name)
    fitted = fit_cost(read_steps(step_log), source=str(step_log))
    write_cost_file(out / "cost.json", fitted.cost, fitted.as_dict())
    return fitted.cost


def run(args: argparse.Namespace) -> int:
    """Write the slices, run every arm on each, print the paired ratios."""
    arms = tuple(a.strip() for a in args.arms.split(",") if a.strip())
    if args.remeasure:
        records = _saved_records(args.out)
        arms = (*arms, *dict.fromkeys(r["arm"] for r in records if r["arm"] not in arms))
        slices = sorted((args.out / "slices").glob("slice-*.csv"),
                        key=lambda p: int(p.stem.split("-")[1]))  # fmt: skip
    else:
        if args.trace is None:
            raise UserError("real-group: --trace is required (unless --remeasure)")
        if args.requests <= args.ranks * args.slots:
            print(f"real-group: {args.requests} requests fit the group's {args.ranks} x "
                  f"{args.slots} slots at once: no request waits, so the saturated figures "
                  "cover only the first prefills", file=sys.stderr)  # fmt: skip
        engine_ready(args.engine)
        spec = SliceSpec(trace=args.trace, repeats=args.repeats, requests=args.requests,
                         prompt_scale=args.prompt_scale, output_scale=args.output_scale,
                         max_model_len=args.max_model_len, skip=args.skip)  # fmt: skip
        slices = write_slices(spec, args.out / "slices")
        if args.learned != "none" and args.skip > 0:
            arms = (*arms, f"brh:{args.learned}@{fit_learned(args.learned, args.out)}")
        group = GroupSpec(url=args.engine, ranks=args.ranks, slots=args.slots,
                          step_log=args.step_log, model=args.model)  # fmt: skip
        study = RealAb(group=group, slices=tuple(slices), out=args.out, arms=arms,
                       seed=args.seed, gateway_flags=tuple(args.gateway_flags))  # fmt: skip
        records = run_study(study, progress=lambda line: print(line, file=sys.stderr, flush=True))
        # kept before measuring: a step log not yet flushed (an emulator's) leaves the runs to
        # --remeasure
        (args.out / "records.json").write_text(json.dumps(records, indent=1))
    attach_engine(records, read_steps(args.step_log), IDLE_S)
    (args.out / "records.json").write_text(json.dumps(records, indent=1))
    table = summarize(records, arms)
    cost = sim_cost(args.sim_cost, args.step_log, args.out)
    sim_records = simulated(slices, arms, args.ranks, args.slots, cost)
    sim = summarize(sim_records, arms, client=False)
    check = group_lockstep(args.step_log)
    held = occupancy(records, args.ranks * args.slots)
    warn_underfilled(held, args.ranks, args.slots)
    info = engine_info(args.engine, args.ranks, args.slots)
    if "version" not in info:  # the engine is down (a --remeasure later): what it said then
        info = _saved_summary(args.out).get("engine", info)
    detail = {"reference": arms[0], "ratios": table, "simulated": sim, "engine": info,
              "simulated_cost": cost.as_dict(), "lockstep": check, "occupancy": held,
              "simulated_over_engine": fidelity(records, sim_records, arms)}  # fmt: skip
    (args.out / "summary.json").write_text(json.dumps(detail, indent=1))
    emulated = None
    if args.emulated is not None:
        emulated = _saved_summary(args.emulated).get("ratios")
        if emulated is None:
            raise UserError(f"--emulated {args.emulated}: no summary.json with ratios there")
    print(json.dumps(headline(info, table, sim, check["holds"], held, emulated)))
    return 0


def warn_underfilled(held: dict[str, float], ranks: int, slots: int) -> None:
    """Say so when a run's ranks held fewer than ``FULL_SHARE`` of the slots while requests
    waited: the study then measured the front end's lag."""
    if not held["min"] < FULL_SHARE:
        return
    print(f"real-group: a run's ranks held {held['min']:.0%} of the {ranks} x {slots} slots "
          f"while requests waited (mean {held['mean']:.0%}): the gateway heard finishes late, "
          "so the ratios measure that lag as much as the routers; on a small machine start the "
          "engine at a lower CPU priority than the gateway and the client "
          "(scripts/real_group.sh: REAL_GROUP_NICE)", file=sys.stderr)  # fmt: skip


def _saved_summary(out: Path) -> dict:
    """A study's summary.json, or an empty dict when there is none."""
    try:
        return json.loads((out / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _saved_records(out: Path) -> list[dict]:
    """The records of a finished study, or a UserError naming what is missing."""
    path = out / "records.json"
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--remeasure: cannot read {path}: {exc}") from None


def _interval(ratio: dict | None) -> dict | None:
    """A paired ratio as the headline writes it (None below two repeats)."""
    if ratio is None:
        return None
    return {"mean": ratio["ratio"], "low": ratio["low"], "high": ratio["high"]}


def _arm_key(arm: str) -> str:
    """An arm's name without its model file (a learned arm's file differs between studies)."""
    return arm.split("@", 1)[0]


def _saturated(row: dict | None, key: str) -> float | None:
    return ((row or {}).get(f"engine.saturated_{key}") or {}).get("ratio")


def headline(engine: dict, table: dict, sim: dict, holds: bool,
             held: dict[str, float] | None = None, emulated: dict | None = None) -> dict:  # fmt: skip
    """The one-line result: each arm's engine ratios to the reference while the pool held
    requests (the paper's figures), over the whole run, the client's, the simulator's and the
    emulator's (``emulated``: that study's ratios; without one, the simulator's); the share of
    the slots the ranks held meanwhile (:func:`occupancy`)."""
    emulated_rows = {_arm_key(a): r for a, r in (emulated or {}).items()}
    arms = {}
    for arm, row in table.items():
        emu = emulated_rows.get(_arm_key(arm)) if emulated is not None else sim[arm]
        arms[arm] = {
            "imbalance_ratio": _interval(row["engine.saturated_imbalance_tokens"]),
            "throughput_ratio": _interval(row["engine.saturated_throughput_tok_s"]),
            "run_imbalance_ratio": _interval(row["engine.imbalance_tokens"]),
            "run_throughput_ratio": _interval(row["engine.throughput_tok_s"]),
            "client_throughput_ratio": _interval(row["client.output_throughput"]),
            "emulated_imbalance_ratio": _saturated(emu, "imbalance_tokens"),
            "emulated_throughput_ratio": _saturated(emu, "throughput_tok_s"),
            "simulated_imbalance_ratio": _saturated(sim[arm], "imbalance_tokens"),
            "simulated_throughput_ratio": _saturated(sim[arm], "throughput_tok_s"),
        }  # fmt: skip
    return {"engine": engine, "arms": arms, "lockstep": bool(holds), "occupancy": held,
            "emulated_by": "emulator" if emulated is not None else "simulator"}  # fmt: skip

"""``balanceroute simulate`` (and the router's other subcommands)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

from balanceroute.features.errors import UserError
from balanceroute.router.balance_route import BalanceRouteConfig
from balanceroute.router.cost import COST_PRESETS, CostModel, cost_preset
from balanceroute.router.prefill import PrefillConfig

DEFAULT_TRAIN_FRACTION = 0.3


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """``--trace FILE | --preset NAME`` and friends, shared by every replaying command."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--trace", help="trace file (Azure, Mooncake, BurstGPT or canonical)")
    src.add_argument("--preset", help="synthetic preset (default paper-prod when no trace)")
    p.add_argument("--requests", type=int, help="use the first N requests (synthetic: N)")
    p.add_argument("--format", default="auto", help="force the trace format")
    p.add_argument("--key-blocks", type=int, default=2, help="Mooncake key: first K hash ids")


def add_tier_args(p: argparse.ArgumentParser) -> None:
    """Decode tier, prefill tier, arrival scaling and cost model."""
    p.add_argument("--slots", type=int, default=64, help="B: slots per worker (max_num_seqs)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--rate-scale", type=float, default=1.0, help="arrivals X times faster")
    load.add_argument(
        "--load", type=float, help="arrivals at X times the estimated decode capacity"
    )
    load.add_argument("--saturate", action="store_true", help="release everything at t=0")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cost", default="paper-dsv3", choices=sorted(COST_PRESETS))
    p.add_argument("--t-fixed", type=float, help="override the preset's fixed step time (s)")
    p.add_argument("--t-token", type=float, help="override the preset's time per KV token (s)")
    p.add_argument("--prefill-instances", type=int, default=4, help="prefill instances P")


def add_router_option_args(p: argparse.ArgumentParser) -> None:
    """One flag per BalanceRoute knob, generated from the configuration dataclass."""
    g = p.add_argument_group("BalanceRoute options (br0, brh)")
    for f in dataclasses.fields(BalanceRouteConfig):
        flag = "--" + f.name.replace("_", "-")
        help_ = f.metadata.get("help", "")
        if f.type in ("bool",) or isinstance(f.default, bool):
            g.add_argument(
                flag,
                dest=f"br_{f.name}",
                action=argparse.BooleanOptionalAction,
                default=None,
                help=help_,
            )
            continue
        kind = {
            "horizon": int,
            "r_max": int,
            "s_greedy": int,
            "window": int,
            "refresh": int,
            "max_overtake": int,
            "max_wait_iters": int,
            "projection": str,
            "penalty": str,
        }.get(f.name, float)
        g.add_argument(
            flag,
            dest=f"br_{f.name}",
            type=_optional(kind),
            default=None,
            help=f"{help_} ('none' to disable)" if "None" in str(f.type) else help_,
        )


def _optional(kind):
    def parse(text: str):
        if text.lower() == "none":
            return "none"
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}") from None

    return parse


def router_options(args: argparse.Namespace) -> dict[str, Any]:
    """The BalanceRoute options the user set explicitly ('none' means None)."""
    out = {}
    for f in dataclasses.fields(BalanceRouteConfig):
        value = getattr(args, f"br_{f.name}", None)
        if value is None:
            continue
        out[f.name] = None if value == "none" else value
    return out


def cost_from_args(args: argparse.Namespace) -> CostModel:
    base = cost_preset(args.cost)
    return dataclasses.replace(
        base,
        t_fixed_s=base.t_fixed_s if args.t_fixed is None else args.t_fixed,
        t_token_s=base.t_token_s if args.t_token is None else args.t_token,
    )


def prefill_from_args(args: argparse.Namespace) -> PrefillConfig:
    return PrefillConfig(
        instances=args.prefill_instances,
        rate_scale=args.rate_scale if args.load is None else 1.0,
        saturate=args.saturate,
    )


def write_json(path: Path, payload: dict) -> None:
    """Write JSON atomically (temp file, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(payload, indent=2, default=_jsonable) + "\n")
    tmp.replace(path)


def _jsonable(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    return str(obj)


def cmd_simulate(args: argparse.Namespace) -> int:
    from balanceroute.features.workload import load_workload
    from balanceroute.router.records import write_records
    from balanceroute.router.runner import (
        TRAINING_FREE,
        ReplaySpec,
        build_estimator,
        replay,
        split_for_training,
    )

    if args.workers < 1 or args.slots < 1:
        raise UserError("--workers and --slots must be at least 1")
    frame, source = load_workload(
        trace=args.trace,
        preset=args.preset,
        requests=args.requests,
        seed=args.seed,
        format=args.format,
        key_blocks=args.key_blocks,
    )
    predictor = args.predictor
    from balanceroute.router.balance_route import takes_estimator

    if takes_estimator(args.router) and predictor is None:
        predictor = "none"
    spec = ReplaySpec(
        router=args.router,
        predictor=predictor,
        model_uri=args.model_uri,
        router_options=router_options(args),
        workers=args.workers,
        slots=args.slots,
        seed=args.seed,
        cost=cost_from_args(args),
        prefill=prefill_from_args(args),
        load=args.load,
    )
    estimator = None
    history = None
    trained_on = None
    if predictor is not None:
        if predictor not in TRAINING_FREE and args.model_uri is None:
            history, frame = split_for_training(frame, args.train_fraction)
            trained_on = {"requests": len(history), "fraction": args.train_fraction}
            print(
                f"training '{predictor}' on the first {len(history)} requests; replaying "
                f"the remaining {len(frame)}",
                file=sys.stderr,
            )
        horizon = spec.router_options.get("horizon", 80)
        estimator = build_estimator(
            predictor,
            replay=frame,
            history=history,
            horizon=max(1, horizon),
            model_uri=args.model_uri,
        )
    if args.predictor_url:
        from balanceroute.serving.client import RemoteEstimator

        estimator = RemoteEstimator(
            args.predictor_url, fallback=estimator, timeout_s=args.predictor_timeout
        )
    result, summary = replay(frame, spec, estimator=estimator, progress=sys.stderr.isatty())
    summary["config"]["workload"] = source
    summary["config"]["trained_on"] = trained_on
    if args.predictor_url:
        summary.update(estimator.stats())
        summary["config"]["predictor_url"] = args.predictor_url
    out = Path(args.out)
    write_records(result, out)
    write_json(out / "summary.json", summary)
    keys = (
        "mean_imbalance",
        "steady_mean_imbalance",
        "throughput_tok_s",
        "tpot_p95_ms",
        "queue_delay_p99_s",
        "router_step_us_p50",
        "iterations",
        "sim_wall_s",
    )
    for key in keys:
        value = summary[key]
        print(f"{key:>24}: {value:,.3f}" if isinstance(value, float) else f"{key:>24}: {value}")
    print(f"wrote {out / 'summary.json'}")
    return 0


def cmd_ab(args: argparse.Namespace) -> int:
    import time

    from balanceroute.features.workload import load_workload
    from balanceroute.router import plots, report
    from balanceroute.router.ab import ABConfig, aggregate, progress_printer, run_ab
    from balanceroute.router.arms import parse_arms

    started = time.perf_counter()
    arms = tuple(parse_arms(args.arms))
    try:
        workers = tuple(int(g) for g in args.workers.split(","))
    except ValueError:
        raise UserError(
            f"--workers takes integers separated by commas, got {args.workers!r}"
        ) from None
    if not workers or min(workers) < 1 or args.slots < 1:
        raise UserError("--workers and --slots must be at least 1")
    frame, source = load_workload(
        trace=args.trace,
        preset=args.preset,
        requests=args.requests,
        seed=args.seed,
        format=args.format,
        key_blocks=args.key_blocks,
    )
    base = cost_from_args(args)
    cfg = ABConfig(
        arms=arms,
        workers=workers,
        slots=args.slots,
        repeats=args.repeats,
        window_fraction=args.window_fraction,
        train_fraction=args.train_fraction,
        seed=args.seed,
        saturate=args.saturate,
        rate_scale=args.rate_scale if args.load is None else 1.0,
        load=args.load,
        cost=base,
        reference=args.reference,
    )
    raw = run_ab(
        frame, cfg, jobs=args.jobs, dask_scheduler=args.dask_scheduler, progress=progress_printer
    )
    agg = aggregate(raw, cfg)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    order = [a.label for a in cfg.arms]
    g0 = report.main_workers(list(workers))
    ref = agg["reference"]
    main = {k: report.at(v, g0, list(workers)) for k, v in agg["arms"].items()}
    best = min(order, key=lambda a: main[a].get("steady_mean_imbalance") or float("inf"))
    made = [
        plots.trajectories(raw, list(dict.fromkeys([ref, best])), g0, out / "trajectories.png"),
        plots.imbalance_distribution(raw, order, g0, out / "imbalance_distribution.png"),
    ]
    if len(workers) > 1:
        made.append(plots.scaling(agg, order, workers, out / "scaling.png"))
    meta = {
        "workload": _describe(source),
        "sha256": source.get("sha256"),
        "plots": [p.name for p in made],
    }
    summary = {
        "arms": {
            k: {**main[k], **({"by_workers": v["by_workers"]} if "by_workers" in v else {})}
            for k, v in agg["arms"].items()
        },
        "reference": ref,
        "config": {
            "arms": order,
            "workers": list(workers),
            "main_workers": g0,
            "slots": args.slots,
            "repeats": args.repeats,
            "windows": raw["info"]["windows"],
            "window_fraction": args.window_fraction,
            "train_fraction": args.train_fraction,
            "saturate": args.saturate,
            "rate_scale": cfg.rate_scale,
            "load": args.load,
            "seed": args.seed,
            "cost": base.as_dict(),
            "workload": source,
            "workload_text": meta["workload"],
            "plots": meta["plots"],
            "estimators": {k: v for k, v in raw["info"].items() if k != "windows"},
            "jobs": args.jobs,
            "dask_scheduler": args.dask_scheduler,
        },
    }
    write_json(out / "summary.json", summary)
    tmp = out / ".report.md.tmp"
    tmp.write_text(report.render(summary))
    tmp.replace(out / "report.md")
    if not args.no_mlflow:
        from balanceroute.router.ab_tracking import log_ab

        try:
            run_id = log_ab(summary, raw, cfg, out, meta)
            print(f"logged to MLflow run {run_id} (experiment balanceroute-ab)", file=sys.stderr)
        except Exception as exc:
            print(
                f"ab: warning: MLflow logging failed ({exc}); results are in {out}", file=sys.stderr
            )
    print(report.table3(main, order))
    print(
        f"\nwrote {out / 'report.md'}, {out / 'summary.json'} and "
        f"{', '.join(str(out / p) for p in meta['plots'])} "
        f"in {time.perf_counter() - started:.0f} s"
    )
    return 0


def cmd_solve_step(args: argparse.Namespace) -> int:
    """Exact IO_H on one posted state, beside the heuristic's decision on the same state."""
    from pydantic import ValidationError

    from balanceroute.router.exact import solve_step, step_objective
    from balanceroute.serving.route_schemas import RouteRequest
    from balanceroute.serving.snapshot import build_snapshot, make_policy

    try:
        req = RouteRequest.model_validate_json(Path(args.state).read_bytes())
    except FileNotFoundError:
        raise UserError(f"state file not found: {args.state}") from None
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"]))
        raise UserError(f"{args.state}: {where}: {first['msg']}") from None
    estimator = None
    if args.model_uri:
        from balanceroute.training.registry import load_estimator

        estimator = load_estimator(args.model_uri)
    snap = build_snapshot(req)
    policy = make_policy(req, estimator)
    if not hasattr(policy, "_projected_loads"):
        raise UserError("solve-step compares BalanceRoute policies (br0, brh, brh-paper)")
    policy.reset(snap.context)
    state = snap.state
    cfg = policy.config
    due = state.admissions_due
    cand = state.pool.head(due + max(cfg.window, cfg.r_max, args.candidates))
    prompts = state.requests.prompt_tokens[cand].astype(float)
    loads = policy._projected_loads(state, prompts[: due + max(cfg.window, cfg.r_max)])
    adm = policy.route(state)
    where = {int(p): j for j, p in enumerate(cand.tolist())}
    chosen = [where[int(p)] for p in adm.positions.tolist()]
    heur = step_objective(loads, prompts, chosen, adm.workers.tolist(), policy.gamma)
    sol = solve_step(
        loads,
        state.free_slots,
        prompts,
        gamma=policy.gamma,
        kv_capacity=cfg.kv_capacity,
        time_limit_s=args.time_limit,
    )
    ids = snap.pool_ids
    first = snap.running

    def named(idx, wk):
        return [
            {"id": ids[int(cand[i]) - first], "worker": int(g)}
            for i, g in zip(idx, wk, strict=True)
        ]

    before = step_objective(loads, prompts, [], [], policy.gamma)
    out = {
        "policy": policy.describe(),
        "candidates": len(cand),
        "objective_before": before,
        "heuristic": {"admissions": named(chosen, adm.workers.tolist()), "objective": heur},
        "exact": {
            "admissions": named(sol.requests.tolist(), sol.workers.tolist()),
            "objective": sol.objective,
            "proven_optimal": sol.optimal,
        },
        "gap": (heur - sol.objective) / max(before, 1.0),
    }
    print(json.dumps(out, indent=2, default=_jsonable))
    return 0


def _describe(source: dict) -> str:
    if source.get("kind") == "trace":
        return f"{source['path']} ({source['format']}, {source['rows']:,} requests)"
    return (
        f"synthetic preset {source.get('preset')} ({source['rows']:,} requests, seed "
        f"{source.get('seed')})"
    )


def register(sub: argparse._SubParsersAction) -> None:
    from balanceroute.router.policy import policy_names

    p = sub.add_parser(
        "simulate",
        help="replay a trace through one router on a simulated decode tier",
        description="Replay requests through a router on G decode workers with B slots each and "
        "write DIR/summary.json (metrics and the resolved configuration), "
        "DIR/iterations.parquet (per-iteration loads) and DIR/requests.parquet (timings).",
    )
    add_workload_args(p)
    p.add_argument("--router", default="count-jsq", choices=policy_names())
    p.add_argument(
        "--predictor",
        help="completion estimator for brh (none, oracle, survival, "
        "exactmatch, gbdt); default none",
    )
    p.add_argument(
        "--model-uri",
        help="load the predictor from MLflow (e.g. "
        "models:/completion-predictor@gbdt) instead of training it",
    )
    p.add_argument(
        "--train-fraction",
        type=float,
        default=DEFAULT_TRAIN_FRACTION,
        help="learned predictors without --model-uri train on this earlier share "
        "of the trace and the rest is replayed",
    )
    p.add_argument("--predictor-url", help="get predictions from a running balanceroute serve")
    p.add_argument(
        "--predictor-timeout",
        type=float,
        default=0.02,
        help="seconds before a remote prediction falls back locally",
    )
    p.add_argument("--workers", type=int, default=8, help="G: workers in the group")
    add_tier_args(p)
    add_router_option_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_simulate)

    p = sub.add_parser(
        "ab",
        help="paired A/B replay of routers and estimators, with a report",
        description="Replay the same requests under several arms (router[:estimator[@uri]]"
        "[{option=value;...}]) and write DIR/summary.json, DIR/report.md and plots; logs a "
        "parent MLflow run with a child run per arm.",
    )
    add_workload_args(p)
    p.add_argument(
        "--arms",
        required=True,
        help="comma-separated arms, e.g. count-jsq,token-jsq,br0,brh:none,brh:survival,brh:oracle",
    )
    p.add_argument("--workers", default="8", help="G, or several: 4,8,16")
    p.add_argument("--repeats", type=int, default=5, help="windows of the replayed trace")
    p.add_argument(
        "--window-fraction",
        type=float,
        default=0.5,
        help="share of the replayed part each repeat covers (when repeats > 1)",
    )
    p.add_argument(
        "--train-fraction",
        type=float,
        default=DEFAULT_TRAIN_FRACTION,
        help="earlier share of the trace that trains on-the-fly estimators",
    )
    p.add_argument("--reference", help="reference arm for ratios (default count-jsq or first)")
    p.add_argument("--jobs", type=int, default=1, help="parallel processes")
    p.add_argument("--dask-scheduler", help="run on an existing Dask cluster at this address")
    p.add_argument("--no-mlflow", action="store_true", help="do not log to MLflow")
    add_tier_args(p)
    p.add_argument("--out", required=True, help="output folder")
    p.set_defaults(func=cmd_ab)

    p = sub.add_parser(
        "solve-step",
        help="solve one routing step exactly (MILP) beside the heuristic's decision",
        description="Read a state in the POST /v1/route body format, run the named BalanceRoute "
        "policy on it, solve IO_H exactly over the same candidates with HiGHS, and print both "
        "decisions, their discounted projected imbalance and the gap (small instances only).",
    )
    p.add_argument("--state", required=True, help="JSON file: a /v1/route request body")
    p.add_argument("--model-uri", help="completion estimator for brh (default: none)")
    p.add_argument(
        "--candidates",
        type=int,
        default=0,
        help="consider at least this many waiting requests (default: the window)",
    )
    p.add_argument("--time-limit", type=float, default=30.0, help="MILP time limit, seconds")
    p.set_defaults(func=cmd_solve_step)

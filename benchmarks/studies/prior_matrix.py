"""Issue 19's target table for one configuration, end to end, with the registered model's prior.

A configuration is a workload (the shared Azure or Mooncake trace, or the paper-prod or
code-completion preset of 20,000 requests), the group's slots B (G = 8) and the load
(saturated, or 1.1x capacity). For each, as docs/results.md ("Every configuration") ran it:

1. ``trace split`` at 0.5: the earlier half is the history, the later half is replayed;
2. ``train`` on the history (survival, exactmatch and gbdt, ``--train-fraction 0.5``), with the
   twin's prior measured on the configuration's group and load, into a SQLite MLflow store in
   the configuration's folder;
3. ``evaluate`` of the three registered models on the replayed half, on the same group and load
   (its recommendation rests on ``twin_ratio``);
4. ``ab`` on the replayed half: 30 windows of 2,048 requests, reference ``brh:none``, each
   estimator's default arm (the twin from the prior) and unguarded arm, and ``brh:oracle``;
5. ``matrix.json`` and ``matrix.md``: per estimator the default and unguarded paired ratios,
   the default's share of a significant unguarded gain and of the oracle's, the noise floor,
   the prior (start weight, upper ends), the twin's windows at w > 0, and ``evaluate``'s pick
   against the A/B's best (paired interval of the two arms over the same windows).

Finished steps are skipped (a ``done`` file per step), so an interrupted study resumes;
progress goes to stderr. Run under ``nice``:

    nice -n 10 .venv/bin/python benchmarks/studies/prior_matrix.py \
        code-completion-b32-saturate code-completion-b32-load --jobs 2 --out runs/prior-matrix
    .venv/bin/python benchmarks/studies/prior_matrix.py --table runs/prior-matrix/*/matrix.json

``--tag NAME --balanceroute PATH`` trains with another checkout's ``balanceroute`` (another
prior) into ``<configuration>/NAME`` and replays only the default arms, paired with the first
run's unguarded arms and oracle (the same windows); ``--no-evaluate`` skips ``evaluate`` (its
twin test costs ``3 x 12`` block replays per estimator).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from balanceroute.router.lab.paired import paired_ratio

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT.parent / "shared" / "data"
ESTIMATORS = ("survival", "exactmatch", "gbdt")
MODEL = "models:/completion-predictor"
METRIC = "steady_mean_imbalance"
FALLBACK = "mean_imbalance"  # where the pool never waits (no steady state): the whole run's
TRACES = {
    "azure": DATA / "azure_llm_2023_conv.csv",
    "mooncake": DATA / "mooncake_conversation.jsonl",
}
PRESETS = ("paper-prod", "code-completion")
PRESET_REQUESTS = 20000
UNGUARDED = "{twin=false;guard=false}"


@dataclass(frozen=True)
class Configuration:
    """One cell of the matrix: workload, slots B (G = 8) and load (None: saturated)."""

    workload: str
    slots: int
    load: float | None

    @classmethod
    def parse(cls, name: str) -> Configuration:
        """``<workload>-b<B>-saturate`` or ``<workload>-b<B>-load`` (1.1x capacity)."""
        try:
            head, b, mode = name.rsplit("-", 2)
            if not b.startswith("b") or mode not in ("saturate", "load"):
                raise ValueError
            slots = int(b[1:])
        except ValueError:
            raise SystemExit(
                f"prior_matrix: configuration '{name}' is not <workload>-b<B>-saturate|load"
            ) from None
        if head not in TRACES and head not in PRESETS:
            known = ", ".join([*TRACES, *PRESETS])
            raise SystemExit(f"prior_matrix: unknown workload '{head}' in '{name}' ({known})")
        return cls(head, slots, None if mode == "saturate" else 1.1)

    @property
    def name(self) -> str:
        return f"{self.workload}-b{self.slots}-{'saturate' if self.load is None else 'load'}"

    def load_args(self) -> list[str]:
        return ["--saturate"] if self.load is None else ["--load", str(self.load)]


def progress(message: str) -> None:
    """One progress line on stderr, with the time and the load average."""
    la = os.getloadavg()[0]
    print(
        f"[prior_matrix {time.strftime('%H:%M:%S')} load {la:.1f}] {message}",
        file=sys.stderr,
        flush=True,
    )


def step(folder: Path, name: str, cmd: list[str], env: dict[str, str], clean: list[Path]) -> dict:
    """Run ``cmd`` once: skipped when ``folder/name.done`` exists; otherwise ``clean`` is removed
    first (a half-finished earlier attempt), the output goes to ``name.log``, and ``name.done``
    records the command, its time and the load average around it."""
    done = folder / f"{name}.done"
    if done.exists():
        progress(f"{folder.name}: {name} already done")
        return json.loads(done.read_text())
    for path in clean:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    progress(f"{folder.name}: {name} ...")
    t0, la0 = time.time(), os.getloadavg()[0]
    with open(folder / f"{name}.log", "w") as log:
        rc = subprocess.run(
            cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=folder
        ).returncode
    if rc != 0:
        raise SystemExit(f"prior_matrix: {name} failed ({rc}); see {folder / (name + '.log')}")
    record = {
        "command": cmd,
        "seconds": round(time.time() - t0, 1),
        "load_average": [round(la0, 1), round(os.getloadavg()[0], 1)],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    done.write_text(json.dumps(record, indent=2) + "\n")
    progress(f"{folder.name}: {name} done in {record['seconds']:.0f} s")
    return record


def split(out: Path, workload: str, br: str, env: dict[str, str]) -> tuple[Path, Path]:
    """The workload's history (earlier half) and replayed half, made once per workload."""
    folder = out / "traces" / workload
    folder.mkdir(parents=True, exist_ok=True)
    source = TRACES.get(workload)
    if source is None:
        source = folder / "trace.parquet"
        step(
            folder,
            "synth",
            [
                br,
                "trace",
                "synth",
                "--preset",
                workload,
                "--requests",
                str(PRESET_REQUESTS),
                "--seed",
                "0",
                "--out",
                str(source),
            ],
            env,
            [source],
        )
    head, tail = folder / "history.parquet", folder / "replay.parquet"
    step(
        folder,
        "split",
        [
            br,
            "trace",
            "split",
            str(source),
            "--at",
            "0.5",
            "--head",
            str(head),
            "--tail",
            str(tail),
        ],
        env,
        [head, tail],
    )
    return head, tail


def arms(estimators: tuple[str, ...], defaults_only: bool = False) -> list[str]:
    """The A/B's arms: ``brh:none``, each estimator's default and unguarded arm, the oracle."""
    out = ["brh:none"]
    for k in estimators:
        out.append(f"brh:{k}@{MODEL}@{k}")
        if not defaults_only:
            out.append(f"brh:{k}@{MODEL}@{k}{UNGUARDED}")
    if not defaults_only:
        out.append("brh:oracle")
    return out


def run_configuration(cfg: Configuration, args: argparse.Namespace) -> Path:
    """Every step of one configuration; returns its folder."""
    br = str(Path(args.balanceroute).resolve())
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true"}
    head, tail = split(args.out, cfg.workload, str(ROOT / ".venv/bin/balanceroute"), env)
    folder = args.out / cfg.name if not args.tag else args.out / cfg.name / args.tag
    folder.mkdir(parents=True, exist_ok=True)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{folder / 'mlflow.db'}"
    est = tuple(args.estimators.split(","))
    twin = ["--twin-group", f"8x{cfg.slots}"]
    if cfg.load is not None:
        twin += ["--twin-load", str(cfg.load)]
    step(
        folder,
        "train",
        [
            br,
            "train",
            "--trace",
            str(head),
            "--estimators",
            ",".join(est),
            "--train-fraction",
            "0.5",
            *twin,
            "--experiment",
            cfg.name,
            "--out",
            "models",
        ],
        env,
        [folder / "models", folder / "mlflow.db", folder / "mlruns"],
    )
    load = ["--load", str(cfg.load)] if cfg.load is not None else []
    if not args.no_evaluate:
        step(
            folder,
            "evaluate",
            [
                br,
                "evaluate",
                "--trace",
                str(tail),
                "--estimator",
                ",".join(est),
                "--workers",
                "8",
                "--slots",
                str(cfg.slots),
                *load,
                "--out",
                "evaluate",
            ],
            env,
            [folder / "evaluate"],
        )
    step(
        folder,
        "ab",
        [
            br,
            "ab",
            "--trace",
            str(tail),
            "--workers",
            "8",
            "--slots",
            str(cfg.slots),
            *cfg.load_args(),
            "--windows",
            str(args.windows),
            "--window-requests",
            str(args.window_requests),
            "--reference",
            "brh:none",
            "--jobs",
            str(args.jobs),
            "--no-mlflow",
            "--arms",
            ",".join(arms(est, defaults_only=bool(args.tag))),
            "--out",
            "ab",
        ],
        env,
        [folder / "ab"],
    )
    matrix = build_matrix(cfg, folder)
    (folder / "matrix.json").write_text(json.dumps(matrix, indent=2) + "\n")
    (folder / "matrix.md").write_text(render(matrix) + "\n")
    progress(f"{cfg.name}: wrote {folder / 'matrix.md'}")
    return folder


def headline_metric(summary: dict[str, Any]) -> str:
    """The steady imbalance, or the whole run's where no window of the reference has a steady
    state (a group at 1.1x capacity whose queue never builds)."""
    ref = summary["arms"][summary["reference"]].get("paired", {})
    return METRIC if METRIC in ref else FALLBACK


def window_values(summary: dict[str, Any], arm: str) -> np.ndarray:
    """The arm's headline imbalance per window (``ab``'s ``repeats``), NaN where none."""
    metric = headline_metric(summary)
    return np.array(
        [
            np.nan if r.get(metric) is None else float(r[metric])
            for r in summary["arms"][arm]["repeats"]
        ],
        dtype=float,
    )


def versus(summary: dict[str, Any], arm: str, other: str) -> dict[str, Any] | None:
    """The paired ratio of ``arm`` to ``other`` over the A/B's windows (its interval)."""
    overlap = float(summary["config"].get("window_overlap") or 1.0)
    pr = paired_ratio(window_values(summary, arm), window_values(summary, other), overlap=overlap)
    return None if pr is None else pr.as_dict()


def share(gain_of: dict[str, Any] | None, of: dict[str, Any] | None) -> float | None:
    """The share ``(1 - r_a) / (1 - r_b)`` of ``b``'s gain that ``a`` recovers, where ``b``'s
    gain is significant (its interval below 1)."""
    if gain_of is None or of is None or of["verdict"] != "better":
        return None
    return (1.0 - gain_of["ratio"]) / (1.0 - of["ratio"])


def twin_info(summary: dict[str, Any], arm: str) -> dict[str, Any]:
    """The prior the default arm's twin started from and its windows at ``w > 0``."""
    stats = summary["config"].get("twin", {}).get(f"{arm} G=8", {})
    weights = [r.get("twin_weight") for r in summary["arms"][arm]["repeats"]]
    known = [w for w in weights if w is not None]
    return {
        "prior": stats.get("twin_prior"),
        "prior_weight": stats.get("twin_prior_weight"),
        "prior_upper": stats.get("twin_prior_upper"),
        "prior_note": stats.get("twin_prior_note"),
        "windows": len(weights),
        "windows_weighted": sum(1 for w in known if w > 0) if known else None,
        "weights": weights,
    }


def with_parent_arms(summary: dict[str, Any], parent: dict[str, Any]) -> dict[str, Any]:
    """A re-run of the default arms (``--tag``) with the unguarded arms and the oracle of the
    configuration's first run: the same windows of the same replay (checked: the reference's
    windows are identical), so they pair window by window."""
    ref = summary["reference"]

    def values(s: dict[str, Any]) -> list:
        return [(r.get(METRIC), r.get(FALLBACK)) for r in s["arms"][ref]["repeats"]]

    same = values(summary) == values(parent)
    if not same or parent["reference"] != ref:
        raise SystemExit("prior_matrix: the re-run's windows differ from the first run's")
    arms = dict(summary["arms"])
    order = list(summary["config"]["arms"])
    for arm in parent["config"]["arms"]:
        if arm not in arms:
            arms[arm] = parent["arms"][arm]
            order.append(arm)
    return {**summary, "arms": arms, "config": {**summary["config"], "arms": order}}


def build_matrix(cfg: Configuration, folder: Path) -> dict[str, Any]:
    """The configuration's target table from its run folder."""
    summary = json.loads((folder / "ab" / "summary.json").read_text())
    parent = folder.parent / "ab" / "summary.json"
    if folder.parent.name == cfg.name and parent.exists():
        summary = with_parent_arms(summary, json.loads(parent.read_text()))
    made = folder / "evaluate" / "recommendation.json"
    rec = json.loads(made.read_text()) if made.exists() else None
    ab_arms = summary["config"]["arms"]
    metric = headline_metric(summary)
    paired = {a: summary["arms"][a].get("paired", {}).get(metric) for a in ab_arms}
    oracle = paired.get("brh:oracle")
    rows = {}
    for k in ESTIMATORS:
        default = f"brh:{k}@{MODEL}@{k}"
        if default not in ab_arms:
            continue
        unguarded = default + UNGUARDED
        d, u = paired[default], paired.get(unguarded)
        rows[k] = {
            "default": d,
            "unguarded": u,
            "share_of_unguarded_gain": share(d, u),
            "share_of_oracle_gain": share(d, oracle),
            "do_no_harm": None if d is None else d["high"] <= 1.03,
            "twin": twin_info(summary, default),
        }
    defaults = {"none": "brh:none", **{k: f"brh:{k}@{MODEL}@{k}" for k in rows}}

    def best_of(candidates: dict[str, str]) -> str:
        def ratio(arm: str) -> float:
            p = paired.get(arm)
            return 1.0 if arm == "brh:none" or p is None else p["ratio"]

        return min(candidates, key=lambda k: ratio(candidates[k]))

    best = best_of(defaults)
    unguarded_arms = {
        "none": "brh:none",
        **{
            k: f"brh:{k}@{MODEL}@{k}{UNGUARDED}"
            for k in rows
            if f"brh:{k}@{MODEL}@{k}{UNGUARDED}" in ab_arms
        },
    }
    best_unguarded = best_of(unguarded_arms) if len(unguarded_arms) > 1 else None

    def judge(best_kind: str, pool: dict[str, str]) -> dict[str, Any]:
        arm = pool.get(rec["pick"], "brh:none")
        if best_kind == rec["pick"]:
            return {"best": best_kind, "verdict": "same"}
        pr = versus(summary, arm, pool[best_kind])
        same = pr is not None and pr["verdict"] != "worse"
        return {
            "best": best_kind,
            "pick_vs_best": pr,
            "verdict": "not significantly different" if same else "worse than the best",
        }

    evaluation = None
    if rec is not None:
        evaluation = {
            "pick": rec["pick"],
            "score": rec["score"],
            "scores": rec["scores"],
            "picked_arm": defaults.get(rec["pick"], "brh:none"),
            "against_defaults": judge(best, defaults),
            "against_unguarded": None
            if best_unguarded is None
            else judge(best_unguarded, unguarded_arms),
        }
    return {
        "configuration": cfg.name,
        "tag": folder.name if folder.parent.name == cfg.name else "",
        "workload": summary["config"]["workload_text"],
        "slots": cfg.slots,
        "load": cfg.load,
        "windows": summary["config"]["windows"]
        if isinstance(summary["config"]["windows"], int)
        else len(summary["config"]["windows"]),
        "window_requests": summary["config"].get("window_requests"),
        "window_overlap": summary["config"].get("window_overlap"),
        "metric": metric,
        "noise_floor": summary.get("noise_floor", {}).get("paired", {}).get(metric),
        "oracle": oracle,
        "estimators": rows,
        "evaluate": evaluation,
        "steps": {
            s: json.loads((folder / f"{s}.done").read_text())
            for s in ("train", "evaluate", "ab")
            if (folder / f"{s}.done").exists()
        },
    }


def cell(p: dict[str, Any] | None) -> str:
    if p is None:
        return "n/a"
    v = {"better": "better", "worse": "worse"}.get(p["verdict"], "~")
    return f"{p['ratio']:.3f} [{p['low']:.3f}, {p['high']:.3f}] {v}"


def pct(x: float | None) -> str:
    return "" if x is None else f"{100 * x:.0f}%"


def prior_text(t: dict[str, Any]) -> str:
    if t.get("prior") != "used":
        return f"no prior ({t.get('prior')})"
    ups = t.get("prior_upper") or []
    shown = ", ".join(f"{u:.3f}" for u in ups[1:]) if len(ups) > 1 else ""
    return f"w = {t['prior_weight']:g} ({shown})"


def render(m: dict[str, Any]) -> str:
    """The configuration's markdown table and its evaluate line."""
    mode = "saturated" if m["load"] is None else f"{m['load']}x capacity"
    if m.get("metric", METRIC) != METRIC:
        mode += "; no steady state: mean imbalance of the whole window"
    lines = [
        f"| {m['configuration']}{' (' + m['tag'] + ')' if m.get('tag') else ''} "
        f"(G = 8, B = {m['slots']}, {mode}) | default | unguarded | "
        "share of the unguarded gain | share of the oracle's | prior (start; upper ends) | "
        "windows at w > 0 |",
        "|---|---|---|---|---|---|---|",
    ]
    for k, r in m["estimators"].items():
        t = r["twin"]
        won = "" if t["windows_weighted"] is None else f"{t['windows_weighted']} of {t['windows']}"
        unguarded_gain = r["unguarded"] is not None and r["unguarded"]["verdict"] == "better"
        lines.append(
            f"| `{k}` | {cell(r['default'])} | {cell(r['unguarded'])} | "
            f"{pct(r['share_of_unguarded_gain']) if unguarded_gain else '(not significant)'} | "
            f"{pct(r['share_of_oracle_gain'])} | {prior_text(t)} | {won} |"
        )
    lines.append(f"| `brh:oracle` | {cell(m['oracle'])} | | | | | |")
    lines.append(f"| noise floor | {cell(m['noise_floor'])} | | | | | |")
    e = m["evaluate"]
    if e is None:
        return "\n".join(lines)
    scores = ", ".join(f"{k} {v:.3f}" for k, v in sorted(e["scores"].items()))
    parts = [f"`evaluate` picks `{e['pick']}` (by {e['score']}: {scores})"]
    for name, j in (
        ("default arms", e["against_defaults"]),
        ("unguarded arms", e["against_unguarded"]),
    ):
        if j is None:
            continue
        extra = "" if "pick_vs_best" not in j else f", pick / best {cell(j['pick_vs_best'])}"
        parts.append(f"best of the {name}: `{j['best']}` ({j['verdict']}{extra})")
    return "\n".join(lines) + "\n\n" + "; ".join(parts) + "."


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("configurations", nargs="*", help="<workload>-b<B>-saturate|load")
    ap.add_argument("--out", type=Path, default=ROOT / "runs" / "prior-matrix")
    ap.add_argument("--jobs", type=int, default=2, help="parallel replays of ab")
    ap.add_argument("--windows", type=int, default=30)
    ap.add_argument("--window-requests", type=int, default=2048)
    ap.add_argument("--estimators", default=",".join(ESTIMATORS))
    ap.add_argument(
        "--balanceroute",
        default=str(ROOT / ".venv/bin/balanceroute"),
        help="the balanceroute that trains and replays (another checkout's)",
    )
    ap.add_argument("--tag", default="", help="sub-folder: a re-run of the default arms")
    ap.add_argument("--no-evaluate", action="store_true", help="no evaluate step (its CPU)")
    ap.add_argument("--table", nargs="*", type=Path, help="print matrix.json files as markdown")
    args = ap.parse_args()
    if args.table:
        for path in args.table:
            print(render(json.loads(path.read_text())) + "\n")
        return
    if not args.configurations:
        ap.error("give configurations or --table")
    args.out = args.out.resolve()
    configs = [Configuration.parse(c) for c in args.configurations]
    failed = []
    for cfg in configs:
        try:
            folder = run_configuration(cfg, args)
        except (SystemExit, Exception) as exc:  # the chain goes on; a re-run resumes this one
            progress(f"{cfg.name}: stopped ({exc})")
            failed.append(cfg.name)
            continue
        print(render(json.loads((folder / "matrix.json").read_text())) + "\n", flush=True)
    if failed:
        raise SystemExit(f"prior_matrix: not finished: {', '.join(failed)}")


if __name__ == "__main__":
    main()

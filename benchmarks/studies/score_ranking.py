"""Which accuracy score ranks estimators the way the A/B replays do?

For every A/B run in ``RUNS`` (``<workload>-b<B>-<mode>/summary.json`` from
``benchmarks/studies/ab_study.sh`` with the arms ``brh:none,brh:survival,brh:exactmatch,brh:gbdt,
brh:hazard,brh:oracle``), the A/B side is each estimator's steady imbalance relative to
``brh:none`` (median of the paired ratios over the repeats). The score side is what
``balanceroute evaluate`` would report for the same workload: the estimators are fitted on the
earlier 70% of the requests and scored on the rest (the per-request scores, the decision-aware
ones, and the replay scores, projection error and replay ratio, from replays with the run's B
and load),
with ``none`` scored alongside (``scores``: one workload, every configuration of the study,
written as JSON). Per run (``rank``), the Spearman correlation over the deployable estimators
(``none`` included, the oracle not) between each score (oriented so that lower is better) and
the A/B ratio; then per score its mean over runs, and how often the estimator it ranks first
is the A/B's best or within 2% of it. Per shared trace, it also checks the recommendation that
``evaluate`` prints (by :data:`balanceroute.training.recommend.RANKING_SCORES`) against the A/B's
best over the trace's runs (geometric mean of the ratios). Prints JSON.

    .venv/bin/python benchmarks/studies/score_ranking.py scores mooncake --out runs/scores/mooncake.json
    .venv/bin/python benchmarks/studies/score_ranking.py rank runs/ab14 --scores runs/scores
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
from pathlib import Path
from typing import Any

import numpy as np
from scipy.stats import spearmanr

from balanceroute.features.constants import DEFAULT_HORIZON
from balanceroute.features.workload import WorkloadSpec, load_workload
from balanceroute.predict.factory import EstimatorSpec, build_estimator
from balanceroute.predict.no_prediction import NoPrediction
from balanceroute.training.decision import router_gamma
from balanceroute.training.evaluate import evaluate_estimator
from balanceroute.training.holdout import make_holdout
from balanceroute.training.recommend import RANKING_SCORES, REFERENCE, SCORE_SIGNS, recommend
from balanceroute.training.replay_scores import ReplayScoreConfig, replay_scores

KINDS = ("survival", "exactmatch", "gbdt", "hazard")
HORIZON = DEFAULT_HORIZON
WITHIN = 0.02
SHARED = {
    "azure": "azure_llm_2023_conv.csv",
    "mooncake": "mooncake_conversation.jsonl",
}
SYNTHETIC = {"paper-prod": WorkloadSpec(preset="paper-prod", requests=20000, seed=0)}


def ab_ratios(summary: dict) -> dict[str, float]:
    """Median over repeats of each ``brh:<kind>`` arm's steady imbalance over ``brh:none``'s."""
    arms = summary["arms"]
    base = arms["brh:none"]["repeats"]
    out = {}
    for kind in (REFERENCE, *KINDS, "oracle"):
        arm = f"brh:{kind}"
        if arm in arms:
            reps = arms[arm]["repeats"]
            key = "steady_mean_imbalance"
            out[kind] = statistics.median(
                a[key] / b[key] for a, b in zip(reps, base, strict=True) if b[key]
            )
    return out


def workload_scores(
    spec: WorkloadSpec, runs: dict[str, dict], log
) -> dict[str, dict[str, dict[str, float]]]:
    """Per run: every score of every kind (and ``none``) for this workload."""
    frame, _ = load_workload(spec)
    holdout = make_holdout(frame, seed=spec.seed)
    fitted = {}
    for kind in KINDS:
        log(f"fitting {kind}")
        spec_k = EstimatorSpec(kind, params={"horizon": HORIZON})
        fitted[kind] = build_estimator(spec_k, history=holdout.train)
    fitted[REFERENCE] = NoPrediction(horizon=HORIZON).fit()
    trained = holdout.arrays.output_tokens[: holdout.first_test]
    gammas = {
        b: router_gamma(trained, b)
        for b in sorted({int(s["config"]["slots"]) for s in runs.values()})
    }
    base: dict[int, dict[str, dict[str, float]]] = {b: {} for b in gammas}
    for b, gamma in gammas.items():  # the discount BR-H sets depends on B
        for kind, est in fitted.items():
            log(f"scoring {kind} (B = {b}, gamma {gamma:.3f})")
            m, _ = evaluate_estimator(copy.deepcopy(est), holdout, HORIZON, gamma)
            base[b][kind] = {k: float(v) for k, v in m.items() if k in SCORE_SIGNS}
    out = {}
    for name, summary in runs.items():
        cfg = summary["config"]
        b = int(cfg["slots"])
        proj = ReplayScoreConfig(slots=b, load=None if cfg["saturate"] else float(cfg["load"]))
        log(f"replay scores for {name}")
        errors = replay_scores(fitted, holdout.test, gammas[b], HORIZON, proj)
        out[name] = {
            k: {**base[b][k], **{s: float(v) for s, v in errors[k].items() if s in SCORE_SIGNS}}
            for k in fitted
        }
    return out


def correlations(ab: dict[str, float], scores: dict[str, dict[str, float]]) -> dict[str, Any]:
    """Per score: Spearman over the deployable kinds, and whether its first pick is the A/B's
    best or within 2% of it."""
    kinds = [k for k in (REFERENCE, *KINDS) if k in ab and k in scores]
    target = [ab[k] for k in kinds]
    best = min(target)
    out: dict[str, Any] = {}
    for score, sign in SCORE_SIGNS.items():
        values = [sign * scores[k][score] for k in kinds]
        if any(not math.isfinite(v) for v in values):
            continue
        rho = spearmanr(values, target).statistic
        first = kinds[int(np.argmin(values))]
        out[score] = {"spearman": float(rho), "first_ok": ab[first] <= best * (1 + WITHIN)}
    return out


CONFIGS = {  # the A/B study's runs per workload: (B, load or None for saturated)
    "b32-saturate": (32, None),
    "b32-load": (32, 1.1),
    "b64-saturate": (64, None),
    "b64-load": (64, 1.1),
}


def scores_command(workload: str, data: Path, out: Path, log) -> None:
    """Compute and write the scores of one workload for every configuration of the study."""
    spec = WorkloadSpec(trace=str(data / SHARED[workload])) if workload in SHARED else None
    spec = spec or SYNTHETIC[workload]
    runs = {
        f"{workload}-{name}": {"config": {"slots": b, "saturate": load is None, "load": load}}
        for name, (b, load) in CONFIGS.items()
    }
    scores = workload_scores(spec, runs, lambda m: log(f"{workload}: {m}"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(scores, indent=2, sort_keys=True) + "\n")


def rank(root: Path, scores_dir: Path) -> dict[str, Any]:
    """Correlations of every score with the A/B runs under ``root``."""
    summaries = {
        p.parent.name: json.loads(p.read_text()) for p in sorted(root.glob("*/summary.json"))
    }
    result: dict[str, Any] = {"runs": {}, "traces": {}}
    per_score: dict[str, list[dict]] = {}
    for wl in (*SHARED, *SYNTHETIC):
        path = scores_dir / f"{wl}.json"
        runs = {n: s for n, s in summaries.items() if n.startswith(wl + "-")}
        if not runs or not path.is_file():
            continue
        scores = json.loads(path.read_text())
        picks, geo = [], {}
        for name, summary in runs.items():
            ab = ab_ratios(summary)
            corr = correlations(ab, scores[name])
            for score, c in corr.items():
                per_score.setdefault(score, []).append(c)
            rec = recommend(scores[name])
            picks.append(rec.pick)
            for k, v in ab.items():
                geo.setdefault(k, []).append(math.log(v))
            result["runs"][name] = {
                "ab_ratio_to_none": ab,
                "scores": scores[name],
                "correlation": corr,
                "recommendation": rec.pick,
            }
        if wl in SHARED:
            mean = {k: math.exp(float(np.mean(v))) for k, v in geo.items() if k != "oracle"}
            best = min(mean.values())
            pick = statistics.mode(picks)
            result["traces"][wl] = {
                "ab_geomean_ratio_to_none": mean,
                "ab_best": min(mean, key=mean.get),
                "recommendation": pick,
                "recommendation_within_2pct": mean[pick] <= best * (1 + WITHIN),
            }
    result["summary"] = {
        score: {
            "mean_spearman": float(np.mean([c["spearman"] for c in cs])),
            "first_pick_ok": f"{sum(c['first_ok'] for c in cs)}/{len(cs)}",
        }
        for score, cs in per_score.items()
    }
    result["ranking_scores"] = list(RANKING_SCORES)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    default = Path(__file__).resolve().parents[3] / "shared" / "data"
    p = sub.add_parser("scores", help="score the estimators of one workload, every config")
    p.add_argument("workload", choices=[*SHARED, *SYNTHETIC])
    p.add_argument("--data", type=Path, default=default, help="folder of the shared traces")
    p.add_argument("--out", type=Path, required=True, help="JSON file to write")
    p = sub.add_parser("rank", help="correlate the scores with the A/B runs; prints JSON")
    p.add_argument("runs", type=Path, help="folder of A/B runs (one sub-folder per run)")
    p.add_argument("--scores", type=Path, required=True, help="folder of the scores' JSON")
    args = parser.parse_args()

    def log(message: str) -> None:
        print(f"score_ranking: {message}", file=sys.stderr, flush=True)

    if args.command == "scores":
        scores_command(args.workload, args.data, args.out, log)
    else:
        print(json.dumps(rank(args.runs, args.scores), indent=2, sort_keys=True))


if __name__ == "__main__":
    main()

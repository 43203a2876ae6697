"""Log an A/B replay to MLflow: one parent run, one child run per arm."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from balanceroute.router.ab import METRICS, ABConfig

EXPERIMENT = "balanceroute-ab"


def log_ab(
    summary: dict[str, Any], raw: dict[str, Any], cfg: ABConfig, out: Path, meta: dict[str, Any]
) -> str:
    """Parent run (config, report, plots, summary) with a child run per arm; returns its id."""
    from balanceroute.training.tracking import setup_mlflow

    setup_mlflow(EXPERIMENT)
    import mlflow

    info = raw["info"]
    with mlflow.start_run(run_name=f"ab-{out.name}") as parent:
        mlflow.log_params(
            {
                "arms": ",".join(a.label for a in cfg.arms)[:500],
                "workers": ",".join(map(str, cfg.workers)),
                "slots": cfg.slots,
                "repeats": len(info["windows"]),
                "saturate": cfg.saturate,
                "load": cfg.load,
                "rate_scale": cfg.rate_scale,
                "reference": summary["reference"],
                "workload": str(meta.get("workload"))[:500],
            }
        )
        mlflow.set_tag("workload_sha256", str(meta.get("sha256")))
        for name in ("report.md", "summary.json"):
            mlflow.log_artifact(str(out / name))
        for plot in meta.get("plots", []):
            mlflow.log_artifact(str(out / plot), artifact_path="plots")
        for arm in cfg.arms:
            stats = summary["arms"][arm.label]
            with mlflow.start_run(run_name=arm.label, nested=True):
                mlflow.log_params(
                    {
                        "arm": arm.label,
                        "router": arm.router,
                        "estimator": arm.estimator,
                        "model_uri": arm.model_uri,
                        **{f"option.{k}": v for k, v in arm.options.items()},
                    }
                )
                reg = info.get("loaded_from_registry", {}).get(arm.label)
                if reg:
                    mlflow.set_tag("model_version", str(reg["version"]))
                if arm.label in info.get("trained_on_the_fly", {}):
                    mlflow.set_tag("estimator_source", "trained on the fly")
                metrics = {m: stats[m] for m in METRICS if stats.get(m) is not None}
                ratio = stats.get("ratio_to_reference", {})
                metrics.update({f"{m}_ratio": v["mean"] for m, v in ratio.items()})
                mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        return parent.info.run_id

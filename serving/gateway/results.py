"""The switchback's results on disk and in MLflow, like ``balanceroute ab``'s.

``DIR/ab/summary.json`` and ``DIR/ab/report.md`` are written first (atomically), then one MLflow
parent run with a child run per arm records them (the conventions of
:mod:`balanceroute.training.experiments`); a tracking failure never loses the files.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from balanceroute.features.files import write_json, write_text
from balanceroute.predict.model_store import setup_mlflow
from balanceroute.serving.gateway.switchback import METRICS, report_markdown

EXPERIMENT = "balanceroute-gateway-ab"


def write_results(summary: dict[str, Any], config: dict[str, Any], folder: Path) -> list[Path]:
    """``summary.json`` (with the resolved configuration) and ``report.md`` in ``folder``."""
    return [
        write_json(folder / "summary.json", {**summary, "config": config}),
        write_text(folder / "report.md", report_markdown(summary, config)),
    ]


def log_switchback(summary: dict[str, Any], config: dict[str, Any], files: list[Path]) -> str:
    """Parent run (configuration, files) with a child run per arm; returns the parent's id."""
    setup_mlflow(EXPERIMENT)
    import mlflow

    with mlflow.start_run(run_name=f"gateway-ab-{Path(files[0]).parent.parent.name}") as parent:
        mlflow.log_params(
            {
                "arms": ",".join(summary["arms"])[:500],
                "window_s": summary["window_s"],
                "warmup_s": summary["warmup_s"],
                "seed": summary["seed"],
                "windows_done": summary["windows_done"],
                "ranks": config.get("ranks"),
                "slots": config.get("slots"),
                "reference": summary["reference"],
            }
        )
        for path in files:
            mlflow.log_artifact(str(path))
        for arm in summary["arms"]:
            row = summary["per_arm"][arm]
            with mlflow.start_run(run_name=arm, nested=True):
                mlflow.log_params({"arm": arm, **config.get("arms", {}).get(arm, {})})
                metrics = {m: row[m] for m in METRICS if row.get(m) is not None}
                for m, d in summary["paired_vs_reference"].get(arm, {}).items():
                    if d["mean"] is not None:
                        metrics[f"{m}_diff"] = d["mean"]
                mlflow.log_metrics({k: float(v) for k, v in metrics.items()})
        return parent.info.run_id


def save_switchback(
    summary: dict[str, Any], config: dict[str, Any], folder: Path, *, track: bool
) -> dict[str, Any]:
    """Write the files, then track them; says where they went and any tracking error."""
    files = write_results(summary, config, folder)
    out: dict[str, Any] = {"files": [str(p) for p in files], "run_id": None, "tracking_error": None}
    if track:
        try:
            out["run_id"] = log_switchback(summary, config, files)
        except Exception as exc:  # the files are on disk: report, never lose them
            out["tracking_error"] = f"{type(exc).__name__}: {exc}"
    return out

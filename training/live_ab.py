"""The gateway's switchback A/B on disk and in MLflow, like ``balanceroute ab``'s results.

``DIR/ab/summary.json`` and ``report.md`` first (atomically), then one MLflow parent run with a
child run per arm (the conventions of :mod:`balanceroute.training.experiments`); a tracking failure
never loses the files (:func:`save_switchback`). The design and statistics are
:mod:`balanceroute.router.lab.switchback`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from balanceroute.features.files import write_json, write_text
from balanceroute.router.lab.switchback import METRICS, report_markdown
from balanceroute.training.tracking import ChildRun, log_parent_with_children

EXPERIMENT = "balanceroute-gateway-ab"


def write_switchback(summary: dict[str, Any], config: dict[str, Any], folder: Path) -> list[Path]:
    """``summary.json`` (with the resolved configuration) and ``report.md`` in ``folder``."""
    return [
        write_json(folder / "summary.json", {**summary, "config": config}),
        write_text(folder / "report.md", report_markdown(summary, config)),
    ]


def log_switchback(summary: dict[str, Any], config: dict[str, Any], files: list[Path]) -> str:
    """Parent run (configuration, files) with a child run per arm; returns the parent's id."""
    keys = ("window_s", "warmup_s", "seed", "windows_done", "reference")
    params = {"arms": ",".join(summary["arms"])[:500], **{k: summary[k] for k in keys},
              "ranks": config.get("ranks"), "slots": config.get("slots")}  # fmt: skip
    children = []
    for arm in summary["arms"]:
        row = summary["per_arm"][arm]
        metrics = {m: row[m] for m in METRICS if row.get(m) is not None}
        for m, d in summary["paired_vs_reference"].get(arm, {}).items():
            if d["mean"] is not None:
                metrics[f"{m}_diff"] = d["mean"]
        arm_params = {"arm": arm, **config.get("arms", {}).get(arm, {})}
        children.append(ChildRun(arm, arm_params, metrics))
    run_name = f"gateway-ab-{Path(files[0]).parent.parent.name}"
    return log_parent_with_children(EXPERIMENT, run_name, params, children,
                                    artifacts=[(path, None) for path in files])  # fmt: skip


def save_switchback(
    summary: dict[str, Any], config: dict[str, Any], folder: Path, *, track: bool
) -> dict[str, Any]:
    """Write the files, then track them; says where they went and any tracking error."""
    files = write_switchback(summary, config, folder)
    out: dict[str, Any] = {"files": [str(p) for p in files], "run_id": None, "tracking_error": None}
    if track:
        try:
            out["run_id"] = log_switchback(summary, config, files)
        except Exception as exc:  # the files are on disk: report, never lose them
            out["tracking_error"] = f"{type(exc).__name__}: {exc}"
    return out

"""What an A/B replay leaves behind: ``summary.json``, ``report.md`` and the plots.

:func:`write_ab_results` turns the raw task results of :func:`balanceroute.router.lab.ab.run_ab`
into the summary (per arm at the headline G, with intervals and paired ratios, and per G when
several were run), writes it with the report and the plots, and returns what it wrote.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from balanceroute.features.files import write_json, write_text
from balanceroute.router.lab import plots, report
from balanceroute.router.lab.ab import ABConfig, aggregate


@dataclass(frozen=True)
class ABResults:
    """An A/B run's summary and the files written for it."""

    summary: dict[str, Any]
    files: list[Path] = field(default_factory=list)

    @property
    def headline_table(self) -> str:
        """The per-arm table at the headline G (the shape of the paper's Table 3)."""
        cfg = self.summary["config"]
        table = report.table3(self.summary["arms"], cfg["arms"])
        if cfg.get("window_requests") is None:
            return table
        return table + "\n\n" + report.paired_table(self.summary)


def describe_workload(source: dict[str, Any]) -> str:
    """One line naming the requests an A/B replayed."""
    if source.get("kind") == "trace":
        return f"{source['path']} ({source['format']}, {source['rows']:,} requests)"
    return (
        f"synthetic preset {source.get('preset')} ({source['rows']:,} requests, seed "
        f"{source.get('seed')})"
    )


def write_ab_results(
    raw: dict[str, Any],
    cfg: ABConfig,
    source: dict[str, Any],
    out: Path,
    *,
    run: dict[str, Any] | None = None,
) -> ABResults:
    """Aggregate, plot and write the run into ``out``; ``run`` adds how it was run (jobs, ...)."""
    agg = aggregate(raw, cfg)
    out.mkdir(parents=True, exist_ok=True)
    workers = list(cfg.workers)
    order = [a.label for a in cfg.arms]
    g0 = report.main_workers(workers)
    ref = agg["reference"]
    main = {k: report.at(v, g0, workers) for k, v in agg["arms"].items()}
    best = min(order, key=lambda a: main[a].get("steady_mean_imbalance") or float("inf"))
    made = [
        plots.trajectories(raw, list(dict.fromkeys([ref, best])), g0, out / "trajectories.png"),
        plots.imbalance_distribution(raw, order, g0, out / "imbalance_distribution.png"),
    ]
    if len(workers) > 1:
        made.append(plots.scaling(agg, order, cfg.workers, out / "scaling.png"))
    summary = {
        "arms": {
            k: {**main[k], **({"by_workers": v["by_workers"]} if "by_workers" in v else {})}
            for k, v in agg["arms"].items()
        },
        "reference": ref,
        **(
            {"noise_floor": report.at(agg["noise_floor"], g0, workers)}
            if "noise_floor" in agg
            else {}
        ),
        "config": {
            "arms": order,
            "workers": workers,
            "main_workers": g0,
            "slots": cfg.slots,
            "repeats": cfg.repeats,
            "windows": raw["info"]["windows"],
            "window_fraction": cfg.window_fraction,
            "train_fraction": cfg.train_fraction,
            "saturate": cfg.saturate,
            "rate_scale": cfg.rate_scale,
            "load": cfg.load,
            "seed": cfg.seed,
            "cost": cfg.cost.as_dict(),
            "workload": source,
            "workload_text": describe_workload(source),
            "plots": [p.name for p in made],
            "estimators": {k: v for k, v in raw["info"].items() if k not in ("windows", "overlap")},
            **(
                {
                    "window_requests": cfg.window_requests,
                    "window_overlap": raw["info"]["overlap"],
                    "noise_floor": cfg.noise_floor,
                }
                if cfg.window_requests is not None
                else {}
            ),
            **(run or {}),
        },
    }
    files = [
        write_json(out / "summary.json", summary),
        write_text(out / "report.md", report.render(summary)),
        *made,
    ]
    return ABResults(summary, files)

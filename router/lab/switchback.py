"""Switchback A/B of routing arms on one live group: split time, not requests.

Arms share one decode group, so they interfere: a live A/B cannot give each arm its own
requests. It alternates them over time windows of ``window_s`` instead. Windows come in blocks of
one window per arm (a *pair* for two arms), in a random order within each block (seeded); the
first ``warmup_s`` of each window is left out of its figures (the previous arm's admissions are
still running). Per window: throughput (tokens streamed per second), TPOT p50/p95 of the requests
that finished in it, queueing delay (arrival at the gateway to forward) p50/p99 of the requests
admitted in it, and the live imbalance (max minus mean of the per-rank KV loads the gateway
tracks, sampled every tick). Each arm is compared with the first one block by block: the mean
of the per-block differences with a Student-t 95% interval over blocks, and for the imbalance
also the geometric-mean ratio. Beside it, the live twin's counterfactual comparison of the same
arms on the same traffic (the gateway's twins: every arm replayed on the same blocks of finished
requests) and whether the two agree (:func:`twin_agreement`). The gateway records into it;
:func:`balanceroute.training.live_ab.save_switchback` writes and tracks the results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.router.lab.paired import ratio_interval, t_interval

METRICS = ("throughput", "tpot_p50_ms", "tpot_p95_ms", "queue_p50_ms", "queue_p99_ms", "imbalance")


@dataclass
class Window:
    """One window of one arm and what was measured after its warm-up."""

    index: int
    block: int
    arm: str
    start: float
    measure_from: float
    end: float
    tokens: int = 0
    tpot_s: list[float] = field(default_factory=list)
    queue_s: list[float] = field(default_factory=list)
    imbalance_sum: float = 0.0
    imbalance_n: int = 0

    def figures(self, now: float) -> dict[str, Any]:
        """The window's metrics (None where nothing was measured)."""
        span = min(now, self.end) - self.measure_from
        tpot = np.asarray(self.tpot_s) * 1e3
        queue = np.asarray(self.queue_s) * 1e3
        return {
            "window": self.index,
            "block": self.block,
            "arm": self.arm,
            "start_s": self.start,
            "end_s": self.end,
            "throughput": self.tokens / span if span > 0 else None,
            "tpot_p50_ms": _pct(tpot, 50),
            "tpot_p95_ms": _pct(tpot, 95),
            "queue_p50_ms": _pct(queue, 50),
            "queue_p99_ms": _pct(queue, 99),
            "imbalance": self.imbalance_sum / self.imbalance_n if self.imbalance_n else None,
            "finished": int(tpot.size),
            "admitted": int(queue.size),
        }


def _pct(values: np.ndarray, q: float) -> float | None:
    return float(np.percentile(values, q)) if values.size else None


class Switchback:
    """The arm schedule and the per-window figures (times in seconds on one clock)."""

    def __init__(
        self, arms: list[str], window_s: float, warmup_s: float, seed: int, start: float
    ) -> None:
        self.arms = list(arms)
        self.window_s = window_s
        self.warmup_s = warmup_s
        self.seed = seed
        self.start = start
        self.rng = np.random.default_rng(seed)
        self.orders: list[list[str]] = []
        self.windows: list[Window] = []
        self.current(start)

    @property
    def switching(self) -> bool:
        return len(self.arms) > 1

    def _order(self, block: int) -> list[str]:
        while len(self.orders) <= block:
            perm = self.rng.permutation(len(self.arms)).tolist()
            self.orders.append([self.arms[i] for i in perm])
        return self.orders[block]

    def current(self, now: float) -> Window:
        """The window running at ``now`` (created as time passes)."""
        index = int((now - self.start) // self.window_s) if self.switching else 0
        while len(self.windows) <= index:
            i = len(self.windows)
            k = len(self.arms)
            start = self.start + i * self.window_s
            end = start + self.window_s if self.switching else math.inf
            warm = self.warmup_s if self.switching else 0.0
            arm = self._order(i // k)[i % k]
            self.windows.append(Window(i, i // k, arm, start, start + warm, end))
        return self.windows[index]

    def _measured(self, now: float) -> Window | None:
        w = self.current(now)
        return w if now >= w.measure_from else None

    # ---- what the gateway records ---------------------------------------------------------
    def tokens(self, n: int, now: float) -> None:
        w = self._measured(now)
        if w is not None:
            w.tokens += n

    def finished(self, tpot_s: float, now: float) -> None:
        w = self._measured(now)
        if w is not None:
            w.tpot_s.append(tpot_s)

    def admitted(self, queue_s: float, now: float) -> None:
        w = self._measured(now)
        if w is not None:
            w.queue_s.append(queue_s)

    def sample(self, imbalance: float, now: float) -> None:
        w = self._measured(now)
        if w is not None:
            w.imbalance_sum += imbalance
            w.imbalance_n += 1

    # ---- the summary ----------------------------------------------------------------------
    def summary(self, now: float) -> dict[str, Any]:
        """Per-arm figures and paired differences against the first arm (finished windows
        only; the current one is listed but not counted)."""
        done = [w.figures(now) for w in self.windows if w.end <= now]
        live = [w.figures(now) for w in self.windows if w.end > now]
        per_arm = {}
        for arm in self.arms:
            rows = [r for r in done if r["arm"] == arm]
            per_arm[arm] = {"windows": len(rows)} | {
                m: _mean([r[m] for r in rows]) for m in METRICS
            }
        reference = self.arms[0]
        paired = {
            arm: {m: difference_by_block(done, reference, arm, m) for m in METRICS}
            for arm in self.arms[1:]
        }
        ratios = {arm: ratio_by_block(done, reference, arm, "imbalance") for arm in self.arms[1:]}
        return {
            "arms": self.arms,
            "reference": reference,
            "imbalance_ratio_vs_reference": ratios,
            "window_s": self.window_s,
            "warmup_s": self.warmup_s,
            "seed": self.seed,
            "windows_done": len(done),
            "per_arm": per_arm,
            "paired_vs_reference": paired,
            "windows": done + live,
        }


def _mean(values: list[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.mean(kept)) if kept else None


def _by_block(
    rows: list[dict[str, Any]], metric: str, positive: bool
) -> dict[int, dict[str, float]]:
    """Per block, each arm's ``metric`` (left out where unmeasured, or not positive if asked)."""
    by_block: dict[int, dict[str, float]] = {}
    for r in rows:
        if r[metric] is not None and (not positive or r[metric] > 0):
            by_block.setdefault(r["block"], {})[r["arm"]] = r[metric]
    return by_block


def difference_by_block(
    rows: list[dict[str, Any]], reference: str, arm: str, metric: str, level: float = 0.95
) -> dict[str, Any]:
    """``arm`` minus ``reference`` block by block: mean difference and its t interval."""
    pairs = [b for b in _by_block(rows, metric, False).values() if arm in b and reference in b]
    mean, half, n = t_interval(np.array([b[arm] - b[reference] for b in pairs]), level=level)
    if n == 0:
        return {"pairs": 0, "mean": None, "low": None, "high": None}
    if n < 2:
        return {"pairs": n, "mean": mean, "low": None, "high": None}
    return {"pairs": n, "mean": mean, "low": mean - half, "high": mean + half}


def ratio_by_block(rows: list[dict[str, Any]], reference: str, arm: str, metric: str) -> dict:
    """``arm`` over ``reference`` block by block: geometric-mean ratio and its t interval."""
    pairs = [b for b in _by_block(rows, metric, True).values() if arm in b and reference in b]
    return ratio_interval(np.array([math.log(b[arm] / b[reference]) for b in pairs]))


def twin_agreement(summary: dict[str, Any], counterfactual: dict[str, Any]) -> dict[str, Any]:
    """Per arm: the switchback's measured imbalance ratio against the reference beside the
    twin's counterfactual one on the same traffic; they agree when both say the same side of
    1 and their 95% intervals overlap (``undecided`` while either has no interval).
    ``identical``: the twin replayed the arm at ``w = 0`` on every block, so the two arms routed
    alike there (a twin-driven arm at ``w = 0`` is the reference): an agreement then says only
    that the switchback found no difference where the twin saw none to find."""
    out = {}
    twin = counterfactual.get("imbalance_ratio_vs_reference", {})
    for arm, measured in summary.get("imbalance_ratio_vs_reference", {}).items():
        t = twin.get(arm)
        w = None if t is None else t.get("weight_mean")
        row: dict[str, Any] = {"measured": measured, "twin": t, "twin_weight_mean": w,
                               "identical": w == 0.0 and bool(t and t.get("blocks")),
                               "same_side": None, "overlap": None,
                               "verdict": "undecided"}  # fmt: skip
        if t is not None and measured["ratio"] is not None and t["ratio"] is not None:
            row["same_side"] = (measured["ratio"] - 1.0) * (t["ratio"] - 1.0) >= 0.0
        if t is not None and None not in (measured["low"], measured["high"], t["low"], t["high"]):
            row["overlap"] = measured["low"] <= t["high"] and t["low"] <= measured["high"]
            row["verdict"] = "agree" if row["same_side"] and row["overlap"] else "disagree"
        out[arm] = row
    return out


def report_markdown(summary: dict[str, Any], config: dict[str, Any]) -> str:
    """``report.md``: per-arm means and the paired intervals against the reference."""
    fmt = _fmt
    lines = [
        "# Switchback A/B at the gateway",
        "",
        f"Arms {', '.join(f'`{a}`' for a in summary['arms'])}; windows of "
        f"{summary['window_s']:g} s, the first {summary['warmup_s']:g} s of each left out; "
        f"{summary['windows_done']} finished windows; G = {config.get('ranks')}, "
        f"B = {config.get('slots')}; seed {summary['seed']}.",
        "",
        "| arm | windows | " + " | ".join(METRICS) + " |",
        "|---|---|" + "---|" * len(METRICS),
    ]
    for arm, row in summary["per_arm"].items():
        cells = " | ".join(fmt(row[m]) for m in METRICS)
        lines.append(f"| `{arm}` | {row['windows']} | {cells} |")
    lines += [
        "",
        f"Paired differences against `{summary['reference']}` (arm minus reference, mean over "
        "blocks, 95% t interval):",
        "",
        "| arm | metric | pairs | mean | interval |",
        "|---|---|---|---|---|",
    ]
    for arm, metrics in summary["paired_vs_reference"].items():
        for m, d in metrics.items():
            interval = "n/a" if d["low"] is None else f"[{fmt(d['low'])}, {fmt(d['high'])}]"
            lines.append(f"| `{arm}` | {m} | {d['pairs']} | {fmt(d['mean'])} | {interval} |")
    lines += _twin_lines(summary)
    lines += [
        "",
        "throughput: tokens streamed per second; TPOT of the requests that finished in the "
        "window; queue: arrival at the gateway to forward, of the requests admitted in it; "
        "imbalance: max minus mean of the per-rank KV loads, sampled every tick.",
        "",
    ]
    return "\n".join(lines)


def _twin_lines(summary: dict[str, Any]) -> list[str]:
    """The twin's counterfactual comparison beside the measured one, and the verdict."""
    agreement = summary.get("twin_agreement")
    if not agreement:
        return []
    cf = summary.get("twin_comparison") or {}
    lines = [
        "",
        f"Imbalance ratio against `{summary['reference']}`: measured by the switchback (per block "
        "of windows) and the live twin's counterfactual (every arm replayed on the same "
        f"{cf.get('block_requests', 'n/a')}-request blocks of finished requests, "
        f"{cf.get('blocks', 0)} blocks), geometric means with 95% t intervals:",
        "",
        "| arm | measured | measured interval | twin | twin interval | twin's w (mean) | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for arm, row in agreement.items():
        m, t = row["measured"], row["twin"] or {}
        lines.append(
            f"| `{arm}` | {_ratio(m.get('ratio'))} | {_interval(m)} | {_ratio(t.get('ratio'))} "
            f"| {_interval(t)} | {_weight(row.get('twin_weight_mean'))} | {row['verdict']} |"
        )
    lines += [
        "",
        "agree: both on the same side of 1 and the intervals overlap; undecided: either has "
        "fewer than two blocks; twin's w: the blend weight the twin-driven arm routed with on "
        "the replayed blocks (none: not twin-driven).",
    ]
    same = [arm for arm, row in agreement.items() if row.get("identical")]
    if same:
        lines += [
            "",
            f"{', '.join(f'`{a}`' for a in same)}: the twin held w = 0 on every replayed block, so "
            "the arm routed as the reference there; an agreement says only that the switchback "
            "found no difference where there was none, not that the estimator was judged.",
        ]
    return lines


def _weight(value: float | None) -> str:
    return "none" if value is None else f"{value:.2f}"


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def _interval(d: dict[str, Any]) -> str:
    if d.get("low") is None:
        return "n/a"
    return f"[{d['low']:.3f}, {d['high']:.3f}]"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:,.2f}"

"""The gateway's event-loop lag: a cheap timer that records how late the loop ran it.

Every ``period_s`` the sampler sleeps until a due time and, when the loop wakes it, records how
long after that time it ran (``balanceroute_gateway_loop_lag_seconds``). A loop that waits for
the GIL (a CPU-bound thread in the process, such as the live twins') or runs a long callback
shows it here before it shows in the ticks, the health checks or ``/metrics`` answering late.
The last :data:`KEEP` samples give the p50, p99 and max in ``/v1/ab`` (``loop_lag``).

The gateway feeds :meth:`LoopLag.record` from its decision loop's regular sample (every
``sample_s``, 100 ms: how late that loop's own timer ran, :meth:`~.dispatch.Dispatcher.run`)
rather than running :meth:`LoopLag.run`: one timer fewer, ten wake-ups a second fewer.
"""

from __future__ import annotations

import asyncio
from collections import deque
from typing import Any

import numpy as np
from prometheus_client import Histogram

PERIOD_S = 0.1  # one sample every 100 ms
KEEP = 36_000  # samples kept for the summary: one hour at PERIOD_S


class LoopLag:
    """Samples the running loop's lateness into ``histogram`` and a bounded window."""

    def __init__(self, histogram: Histogram, period_s: float = PERIOD_S, keep: int = KEEP) -> None:
        if not period_s > 0:
            raise ValueError(f"loop-lag period_s must be > 0, got {period_s}")
        self.histogram = histogram
        self.period_s = period_s
        self.samples: deque[float] = deque(maxlen=keep)
        self.max_s = 0.0
        self.count = 0

    def record(self, lag_s: float) -> None:
        """One sample: the loop ran the timer ``lag_s`` after its due time (never negative)."""
        lag = max(0.0, lag_s)
        self.histogram.observe(lag)
        self.samples.append(lag)
        self.max_s = max(self.max_s, lag)
        self.count += 1

    async def run(self) -> None:
        """Sample until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            due = loop.time() + self.period_s
            await asyncio.sleep(self.period_s)
            self.record(loop.time() - due)

    def summary(self) -> dict[str, Any]:
        """p50, p99 and max of the kept samples (seconds), the max since start and the count."""
        out: dict[str, Any] = {"samples": self.count, "max_s": round(self.max_s, 6),
                               "period_s": self.period_s}  # fmt: skip
        if self.samples:
            a = np.fromiter(self.samples, dtype=float, count=len(self.samples))
            p50, p99 = np.percentile(a, [50, 99])
            out.update(p50_s=round(float(p50), 6), p99_s=round(float(p99), 6),
                       window_max_s=round(float(a.max()), 6))  # fmt: skip
        return out

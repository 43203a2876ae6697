"""Engine-side step telemetry: one CSV row per forward pass of every data-parallel rank.

A MoE data-parallel group steps together: a rank with nothing scheduled runs a dummy forward
pass while any rank has work, so the busiest rank sets every rank's step. vLLM's Prometheus
counters count real steps only, so the barrier cannot be seen from outside. With
``BALANCEROUTE_STEP_LOG=DIR`` set in the server's environment, every engine core process appends
to ``DIR/steps-dp{rank}-{pid}.csv`` (columns ``COLUMNS``), one line per pass, flushed per line:

- ``kind``: ``real`` (the scheduler ran requests) or ``dummy`` (an idle rank keeping step);
- ``start_s``, ``end_s``: wall clock (``time.time()``) around the pass;
- ``scheduled_tokens``, ``prefill_tokens``: tokens computed in the pass, and how many of them
  were prompt tokens (a prefill chunk);
- ``decode_requests``: scheduled requests past their prompt; ``running``, ``waiting``: the
  scheduler's queues after scheduling;
- ``kv_tokens``: KV tokens the scheduled requests hold once the pass is done (the load ``L_g``);
- ``new_tokens``: output tokens the pass sampled;
- ``comm_s``: seconds spent in the plugin's collectives during the pass (CPU only; empty on
  other platforms), the rank's wait at the group's barrier included.
"""

from __future__ import annotations

import os
import time
from typing import Any

COLUMNS = ("rank", "pass", "kind", "start_s", "end_s", "scheduled_tokens", "prefill_tokens",
           "decode_requests", "running", "waiting", "kv_tokens", "new_tokens", "comm_s")  # fmt: skip
ENV = "BALANCEROUTE_STEP_LOG"


class StepLog:
    """The CSV of one engine core process, opened on its first pass."""

    def __init__(self, folder: str, rank: int) -> None:
        os.makedirs(folder, exist_ok=True)
        self.path = os.path.join(folder, f"steps-dp{rank}-{os.getpid()}.csv")
        self.rank = rank
        self.passes = 0
        self.file = open(self.path, "a", buffering=1, encoding="ascii")
        self.file.write(",".join(COLUMNS) + "\n")

    def write(self, kind: str, start: float, end: float, stats: tuple, new_tokens: int,
              comm_s: float | None) -> None:  # fmt: skip
        """Append one pass."""
        comm = "" if comm_s is None else f"{comm_s:.6f}"
        fields = ",".join(str(v) for v in stats)
        self.file.write(f"{self.rank},{self.passes},{kind},{start:.6f},{end:.6f},{fields},"
                        f"{new_tokens},{comm}\n")  # fmt: skip
        self.passes += 1


_LOGS: dict[int, StepLog] = {}
IDLE_STATS = (0, 0, 0, 0, 0, 0)


def _log_for(core: Any) -> StepLog | None:
    folder = os.environ.get(ENV)
    if not folder:
        return None
    log = _LOGS.get(id(core))
    if log is None:
        rank = int(core.vllm_config.parallel_config.data_parallel_rank or 0)
        log = _LOGS[id(core)] = StepLog(folder, rank)
    return log


def _comm_seconds() -> float | None:
    from balanceroute_vllm.collectives import COMM_SECONDS, INSTALLED

    return COMM_SECONDS[0] if INSTALLED[0] else None


def schedule_stats(scheduler: Any, out: Any) -> tuple:
    """(scheduled, prefill, decode requests, running, waiting, KV tokens) of one schedule."""
    prefill = decode = kv = 0
    requests = scheduler.requests
    for rid, n in out.num_scheduled_tokens.items():
        req = requests.get(rid)
        if req is None:
            continue
        before = req.num_computed_tokens - n  # vLLM advances it inside schedule()
        in_prompt = max(0, min(n, req.num_prompt_tokens - before))
        prefill += in_prompt
        decode += in_prompt == 0
        kv += req.num_computed_tokens
    return (out.total_num_scheduled_tokens, prefill, decode, len(scheduler.running),
            len(scheduler.waiting), kv)  # fmt: skip


def _count_new_tokens(outputs: Any) -> int:
    n = 0
    for eco in (outputs or {}).values():
        for o in getattr(eco, "outputs", None) or ():
            n += len(o.new_token_ids)
    return n


def install() -> bool:
    """Wrap the scheduler's ``schedule``, the core's ``step`` and ``execute_dummy_batch``."""
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.core import EngineCore

    if getattr(EngineCore.step, "_balanceroute", False):
        return False
    schedule, step, dummy = Scheduler.schedule, EngineCore.step, EngineCore.execute_dummy_batch

    def timed_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        out = schedule(self, *args, **kwargs)
        if os.environ.get(ENV):
            self._balanceroute_stats = schedule_stats(self, out)
        return out

    def timed_step(self: Any) -> Any:
        log = _log_for(self)
        if log is None:
            return step(self)
        comm0, start = _comm_seconds(), time.time()
        outputs, executed = step(self)
        end = time.time()
        stats = getattr(self.scheduler, "_balanceroute_stats", None)
        self.scheduler._balanceroute_stats = None
        if executed and stats is not None:
            comm = None if comm0 is None else _comm_seconds() - comm0
            log.write("real", start, end, stats, _count_new_tokens(outputs), comm)
        return outputs, executed

    def timed_dummy(self: Any) -> Any:
        log = _log_for(self)
        if log is None:
            return dummy(self)
        comm0, start = _comm_seconds(), time.time()
        result = dummy(self)
        comm = None if comm0 is None else _comm_seconds() - comm0
        log.write("dummy", start, time.time(), IDLE_STATS, 0, comm)
        return result

    timed_step._balanceroute = True  # type: ignore[attr-defined]
    Scheduler.schedule = timed_schedule  # type: ignore[method-assign]
    EngineCore.step = timed_step  # type: ignore[method-assign]
    EngineCore.execute_dummy_batch = timed_dummy  # type: ignore[method-assign]
    return True

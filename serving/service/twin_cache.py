"""The twin of ``/v1/route`` calls: one live twin per (arm, policy), fed by the calls themselves.

A routing call builds a fresh policy (no state leaks between callers), but the twin that
chooses BR-H's blend weight learns across calls: it lives here, one per model arm and policy
name (a bounded set), and runs in one child process (:mod:`balanceroute.serving.twinproc`:
the replays hold none of the service's GIL); the calls feed it and read its reports, never
waiting.
The service learns of a request's life from the snapshots it is sent: a pool id seen for the
first time **arrived** at ``time_s - waited_s``; an id posted running and absent from the next
call (in neither the pool nor running) **finished** at that call, with ``age`` at its last call
plus the iterations since (exact when the dispatcher calls every iteration); an id this
service admitted and never saw running finished within one call (``iteration`` difference
tokens); an id that left the pool unadmitted was **dropped** (never replayed). Only ids of the
last call are kept, so memory is bounded by the pool and the running requests.

The same lives score the model's predictions live (:class:`~balanceroute.predict.live_quality.
LiveQuality`, ``quality``, on ``/metrics``): what the model predicted for each request this
service admitted, at admission (age 0), against the output length its finish shows (exact when
the dispatcher calls every iteration). The service keeps no completion log: its callers' ids and
lengths are known only through these snapshots.

The twin's weight is read at the call (never waited for: the child's last report); until the
twin has evidence it is the start weight, ``w = 0``: the arm routes exactly as ``brh:none``
does; while the child is down, ``w = 0`` too.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from balanceroute.predict.base import CompletionEstimator
from balanceroute.predict.live_quality import LiveQuality
from balanceroute.router.lab.cost import CostModel
from balanceroute.router.lab.twin.config import TwinConfig, TwinGroup
from balanceroute.router.lab.twin.live import pending_limit
from balanceroute.router.lab.twin.prior_start import live_start
from balanceroute.router.lab.twin.sequential import SequentialTest
from balanceroute.router.policies.specs import RouterSpec
from balanceroute.serving.service.decode import key_column
from balanceroute.serving.service.route_schemas import RouteRequest
from balanceroute.serving.twinproc.child import TwinMaker
from balanceroute.serving.twinproc.process import ProcChannel, TwinProcess

JOB = "twin"


@dataclass(slots=True)
class _Seen:
    ticket: int
    running: bool = False
    age: int = 0  # tokens at the last call it ran in
    at: int = 0  # iteration of the last call it was seen in
    admitted_at: int | None = None  # iteration of the call of this service that admitted it


@dataclass(slots=True)
class _Stream:
    channel: ProcChannel
    shape: tuple[int, int]
    start: float | SequentialTest | None = None  # where its twin starts (a model's prior)
    seen: dict[Any, _Seen] = field(default_factory=dict)
    last_iteration: int = -1


class RouteTwins:
    """The live twins of the service's ``/v1/route`` calls, by ``(arm, policy)``."""

    def __init__(
        self,
        config: TwinConfig | None = None,
        *,
        cost: CostModel | None = None,
        start: float | SequentialTest | None = None,
    ) -> None:
        self.config = config or TwinConfig()
        self.cost = cost or CostModel()
        self.start = start
        self.worker = TwinProcess(cpu_share=self.config.cpu_share)
        self._streams: dict[tuple[str, str], _Stream] = {}
        self.quality = LiveQuality()

    def run(self) -> None:
        """Start the twins' process (the child itself starts with the first twin)."""
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop()

    def for_call(
        self,
        arm: str,
        policy: str,
        req: RouteRequest,
        estimator: CompletionEstimator,
        lock: threading.Lock,
    ) -> float:
        """Tell the twin of ``arm`` under ``policy`` what this call shows (arrivals, finishes,
        drops) and return the weight to route with now. The twin is made on first use, or
        anew when G or B changed or the iteration went back (a new dispatcher): its copy of
        ``estimator`` is pickled to the child under ``lock``."""
        g = len(req.workers)
        b = req.slots or max(len(w.running) + w.free_slots for w in req.workers)
        key = (arm, policy)
        stream = self._streams.get(key)
        if stream is None or stream.shape != (g, b) or req.iteration < stream.last_iteration:
            stream = self._new_stream(key, req, g, b, estimator, lock)
        self._track(stream, req, key)
        self.worker.pump()
        if self.worker.down:
            return 0.0
        job = stream.channel.job(JOB)
        return self._start_weight(stream) if job is None else job.weight

    def _start_weight(self, stream: _Stream) -> float:
        s = stream.start
        if isinstance(s, SequentialTest):
            return s.weight
        return self.config.start_weight if s is None else float(s)

    def _new_stream(
        self,
        key: tuple[str, str],
        req: RouteRequest,
        g: int,
        b: int,
        estimator: CompletionEstimator,
        lock: threading.Lock,
    ) -> _Stream:
        self.worker.drop(key)
        channel = self.worker.channel(key, pending_limit(self.config, g, b))
        options = req.options.overrides() if req.options is not None else {}
        group = TwinGroup(RouterSpec(req.policy, None, options), g, b, self.cost, req.seed)
        model = getattr(estimator, "_estimator", estimator)  # the store's, not its lock wrapper
        cfg, start = self.config, self.start
        if start is None:  # the model's prior for this group, if it carries one
            with lock:
                start = live_start(model, g, b, cfg)
        channel.add(
            JOB, TwinMaker(group, model, cfg, start), lock
        )  # observe() updates it under lock
        stream = self._streams[key] = _Stream(channel, (g, b), start)
        return stream

    def _track(self, stream: _Stream, req: RouteRequest, key: tuple[str, str]) -> None:
        """Arrivals, finishes and drops since the last call, into the feed (and the finishes
        into the live quality)."""
        k, t = req.iteration, req.time_s
        feed, seen = stream.channel.feed, stream.seen
        running = {r.id: r.age for w in req.workers for r in w.running}
        pool_ids = {p.id for p in req.pool}
        for rid in [rid for rid in seen if rid not in running and rid not in pool_ids]:
            s = seen.pop(rid)
            if s.running or s.admitted_at is not None:
                tokens = s.age + max(1, k - s.at) if s.running else max(1, k - s.admitted_at)
                feed.finished(s.ticket, tokens, t)
                self.quality.finish((*key, rid), tokens)
            else:
                feed.dropped(s.ticket)
        fresh = [p for p in req.pool if p.id not in seen]
        if fresh:
            keys = key_column([p.prompt_key for p in fresh])
            assert keys is not None  # validated keys always decode
            for p, key in zip(fresh, keys.tolist(), strict=True):
                ticket = feed.arrived(max(0.0, t - p.waited_s), p.prompt_tokens, key)
                seen[p.id] = _Seen(ticket, at=k)
        for rid, age in running.items():
            s = seen.get(rid)
            if s is not None:
                s.running, s.age, s.at = True, age, k
        stream.last_iteration = k
        feed.tick(k)

    def admitted(
        self,
        arm: str,
        policy: str,
        ids: list[Any],
        iteration: int,
        req: RouteRequest | None = None,
        estimator: CompletionEstimator | None = None,
    ) -> None:
        """The pool ids this call admitted (they may finish before the next call); with the
        call and its model, what the model predicts for them now is kept for the live quality."""
        stream = self._streams.get((arm, policy))
        if stream is None:
            return
        for rid in ids:
            s = stream.seen.get(rid)
            if s is not None:
                s.admitted_at = iteration
        if req is not None and estimator is not None and ids:
            by_id = {p.id: p for p in req.pool}
            pool = [by_id[rid] for rid in ids if rid in by_id]
            tokens = np.array([p.prompt_tokens for p in pool], dtype=np.int64)
            keys = key_column([p.prompt_key for p in pool])
            self.quality.admit(estimator, [(arm, policy, p.id) for p in pool], tokens, keys)

    def drop(self, arm: str) -> None:
        """Forget an arm's twins (its model changed: the verdict was about the old one)."""
        for key in [k for k in self._streams if k[0] == arm]:
            del self._streams[key]
            self.worker.drop(key)

    def stats(self) -> list[dict[str, Any]]:
        """Every twin's state: arm, policy, weight, blocks judged, switches, CPU, lag."""
        self.worker.pump()
        out = []
        for (arm, policy), stream in list(self._streams.items()):
            ch = stream.channel
            job = ch.job(JOB)
            row: dict[str, Any] = {"arm": arm, "policy": policy}
            if job is None:
                w = 0.0 if self.worker.down else self._start_weight(stream)
                row.update({"twin_weight": w, "twin_decisions": 0,
                            "twin_switches": 0, "twin_cpu_s": 0.0, "twin_lag_blocks": 0})  # fmt: skip
            else:
                row.update(job.stats())
            row.update(ch.order.stats())
            if JOB in ch.errors:
                row["twin_error"] = ch.errors[JOB]
            out.append(row)
        return out

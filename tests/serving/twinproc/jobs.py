"""Twins the twins' child process builds in tests (pickled factories, imported by the child):
one pinned at a weight that says in which process it stepped, one stuck in its step, one that
reports the rows it was fed."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from balanceroute.predict.base import CompletionEstimator
from balanceroute.router.lab.twin.config import Finished, TwinConfig, TwinGroup
from balanceroute.router.lab.twin.live import Channel, LiveTwin


class Pinned(LiveTwin):
    """A live twin whose weight is ``pinned``; its stats name the processes it stepped in."""

    def __init__(self, group: TwinGroup, config: TwinConfig, pinned: float) -> None:
        super().__init__(group, None, config)
        self.pinned = pinned
        self.step_pids: set[int] = set()

    @property
    def weight(self) -> float:
        return self.pinned

    def step(self) -> int:
        self.step_pids.add(os.getpid())
        return super().step()

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "pid": os.getpid(), "step_pids": sorted(self.step_pids)}


@dataclass
class PinnedMaker:
    group: TwinGroup
    config: TwinConfig
    pinned: float

    def __call__(self, channel: Channel) -> LiveTwin:
        return Pinned(self.group, self.config, self.pinned)


class Stuck(LiveTwin):
    """A twin whose first step marks ``marker`` and never ends (until its process does)."""

    marker = ""

    def step(self) -> int:
        part = Path(f"{self.marker}.part")
        part.write_text(str(os.getpid()))
        part.rename(self.marker)  # whole when seen
        time.sleep(600)
        return super().step()


@dataclass
class StuckMaker:
    group: TwinGroup
    model: CompletionEstimator | None
    config: TwinConfig
    marker: str

    def __call__(self, channel: Channel) -> LiveTwin:
        job = Stuck(self.group, self.model, self.config)
        job.marker = self.marker
        return job


class Recording(LiveTwin):
    """A live twin that reports every numbered row it was fed: (arrival number, output)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.fed: list[tuple[int, int]] = []

    def observe(self, rows: Finished) -> None:
        self.fed += zip(rows.index.tolist(), rows.output_tokens.tolist(), strict=True)
        super().observe(rows)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "fed": list(self.fed)}


@dataclass
class RecordingMaker:
    group: TwinGroup
    model: CompletionEstimator | None
    config: TwinConfig

    def __call__(self, channel: Channel) -> LiveTwin:
        return Recording(self.group, self.model, self.config)

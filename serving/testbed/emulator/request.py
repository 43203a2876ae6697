"""One request inside the emulated group: its state, tokens and times (what the logs record)."""

from __future__ import annotations

import asyncio

import numpy as np

WAITING, RUNNING, FINISHED, CANCELLED, ABORTED = range(5)


class EmuRequest:
    """One request inside the group; the HTTP handler reads ``generated`` as it grows."""

    __slots__ = (
        "admit_iter",
        "admit_s",
        "arrival_iter",
        "cancelled",
        "closer",
        "endpoint",
        "finish_reason",
        "finish_s",
        "first_sent_s",
        "first_token_s",
        "generated",
        "max_tokens",
        "prefill_left",
        "prompt_tokens",
        "rank",
        "recv_s",
        "refs",
        "request_id",
        "seq",
        "state",
        "stream",
        "target",
        "waker",
    )

    def __init__(
        self,
        seq: int,
        request_id: str,
        rank: int,
        endpoint: str,
        stream: bool,
        prompt_tokens: int,
        max_tokens: int,
        target: int,
        recv_s: float,
    ) -> None:
        self.seq = seq
        self.request_id = request_id
        self.rank = rank
        self.endpoint = endpoint
        self.stream = stream
        self.prompt_tokens = prompt_tokens
        self.max_tokens = max_tokens
        self.target = target
        self.finish_reason = "length" if target == max_tokens else "stop"
        self.generated = 0
        self.prefill_left = 0  # prompt tokens still to compute (colocated prefill only)
        self.arrival_iter = -1
        self.admit_iter = -1
        self.recv_s = recv_s
        self.admit_s = np.nan
        self.first_token_s = np.nan
        self.first_sent_s = np.nan
        self.finish_s = np.nan
        self.state = WAITING
        self.cancelled = False
        self.waker: asyncio.Future | None = None  # a streaming handler waiting for tokens
        self.closer: asyncio.Future | None = None  # a handler waiting for the end only
        self.refs = 2  # the group and the HTTP handler: logged when both are done

    @property
    def closed(self) -> bool:
        """True once the group is done with the request (finished, cancelled or aborted)."""
        return self.state >= FINISHED

    def wake(self) -> None:
        """Resolve the handler's pending waits, if any."""
        for name in ("waker", "closer"):
            w = getattr(self, name)
            if w is not None:
                setattr(self, name, None)
                if not w.done():
                    w.set_result(None)

    def row(self, t0: float) -> tuple:
        """This request's record for the request log (times relative to ``t0``)."""
        reason = {FINISHED: self.finish_reason, CANCELLED: "abort", ABORTED: "abort"}.get(
            self.state, "abort"
        )
        return (
            self.seq,
            self.request_id,
            self.rank,
            self.endpoint,
            self.stream,
            self.prompt_tokens,
            self.max_tokens,
            self.target,
            self.generated,
            reason,
            self.arrival_iter,
            self.admit_iter,
            self.recv_s - t0,
            self.admit_s - t0,
            self.first_token_s - t0,
            self.first_sent_s - t0,
            self.finish_s - t0,
        )

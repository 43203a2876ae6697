"""The gateway's configuration: one pydantic-settings class, from flags or ``BALANCEROUTE_*``.

It extends :class:`~balanceroute.serving.service.settings.ServiceSettings` (listening, the bearer token,
the Host and Origin allow-lists: the same rules as ``serve``) with the decode group behind it,
the router or the switchback arms, the estimator, and the gateway's own bounds.
"""

from __future__ import annotations

from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from balanceroute.features.constants import MAX_SLOTS, MAX_WORKERS
from balanceroute.serving.http.settings import ServiceSettings


def check_rank_url(url: str) -> str:
    """``url`` without a trailing slash if it is an http(s) base URL with a host; else a
    ValueError naming it."""
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"rank URL '{url}': {exc}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"rank URL '{url}' is not an http(s) URL such as http://127.0.0.1:8001")
    if port is not None and not 1 <= port <= 65535:
        raise ValueError(f"rank URL '{url}': port {port} is out of range 1..65535")
    return url.rstrip("/")


class GatewaySettings(ServiceSettings):
    """Everything ``balanceroute gateway`` needs (``balanceroute gateway --help`` for the flags)."""

    port: int = Field(default=8000, ge=0, le=65535, description="TCP port (0 = any free one)")
    # The rank URLs: code reads them as ``rank_urls`` (``ranks`` elsewhere counts them, G, or
    # holds their states); the field keeps the name of its input (``--rank`` fills it, once per
    # rank, ``BALANCEROUTE_RANKS`` sets it as a JSON list, error messages say ``ranks``).
    ranks: list[str] = Field(
        min_length=1,
        description="base URL of one rank, in rank order (repeat per rank); with --rank-header, "
        "the one upstream URL",
        json_schema_extra={"flag": "--rank", "metavar": "URL"},
    )
    rank_header: str | None = Field(
        default=None,
        description="header mode: the header naming the chosen rank (vLLM: X-data-parallel-rank)",
    )
    group_size: int | None = Field(
        default=None, ge=1, le=MAX_WORKERS, description="header mode: G, the ranks behind the "
        "upstream", json_schema_extra={"flag": "--ranks"},
    )  # fmt: skip
    slots: int = Field(ge=1, le=MAX_SLOTS, description="B: requests in flight per rank at most")
    router: str = Field(default="brh", description="router spec, as in simulate and ab")
    estimator: str | None = Field(
        default=None, description="the router's estimator, e.g. "
        "gbdt@models:/completion-predictor@champion (default: none; survival, exactmatch, gbdt "
        "without a URI need --history)", json_schema_extra={"metavar": "KIND[@MODEL_URI]"},
    )  # fmt: skip
    estimator_url: str | None = Field(
        default=None, description="a prediction service (balanceroute serve) for the router"
    )
    estimator_timeout_s: float = Field(
        default=0.01, gt=0, le=1, allow_inf_nan=False, description="budget of one remote call"
    )
    history: str | None = Field(
        default=None, description="trace to fit estimators given without a model URI",
        json_schema_extra={"metavar": "TRACE"},
    )  # fmt: skip
    arms: str | None = Field(default=None, description="switchback arms, comma-separated specs")
    switch_every_s: float = Field(
        default=30.0, gt=0, le=86_400, allow_inf_nan=False, description="switchback window"
    )
    warmup_s: float | None = Field(
        default=None,
        ge=0,
        allow_inf_nan=False,
        description="start of each window left out of its figures (default: a quarter of it)",
    )
    seed: int = Field(default=0, ge=0, le=2**32 - 1, description="seed of the arm order")
    get_load: Literal["sglang", "load"] = Field(
        default="sglang",
        description="shape of GET /get_load for a front router: SGLang's list per rank "
        '(sglang-router) or {"load": n} (vllm-router)',
    )
    tokenizer: str | None = Field(
        default=None, description="a Hugging Face tokenizer.json for exact prompt counts",
        json_schema_extra={"metavar": "FILE"},
    )  # fmt: skip
    max_pool: int = Field(
        default=4096, ge=1, le=1_048_576, description="waiting requests at most (429 above)"
    )
    tick_s: float = Field(
        default=0.01,
        gt=0,
        le=1,
        allow_inf_nan=False,
        description="the decision loop's tick (no longer than one engine step)",
    )
    decide: Literal["step", "now"] = Field(
        default="step",
        description="when the router decides: 'step' holds the decisions asked for while the "
        "group is at least half full until just before its next step ends (its phase from the "
        "tokens heard, the margin from the measured lags), so a burst and one step's finishes "
        "are placed together (routers that choose among the pool: brh, br0; first-come ones "
        "such as count-jsq decide at once); 'now' decides each at once, for ranks that do not "
        "step together (dense models served data parallel have no barrier)",
    )
    sample_s: float | None = Field(
        default=None,
        gt=0,
        le=60,
        allow_inf_nan=False,
        description="seconds between two samples of the group (metrics, the switchback's "
        "imbalance, OUT/ticks.parquet) while no request waits; every tick while one does "
        "(default: 0.1 s while arms alternate, for the switchback's imbalance; else 1 s, as "
        "each sample wakes the gateway and the metrics need no more)",
    )
    health_interval_s: float = Field(
        default=1.0, gt=0, le=60, allow_inf_nan=False, description="seconds between health checks"
    )
    health_fall: int = Field(
        default=3, ge=1, le=100, description="failed health checks in a row that take a rank out"
    )
    health_rise: int = Field(
        default=2, ge=1, le=100, description="good health checks in a row that bring it back"
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, le=60, allow_inf_nan=False, description="upstream connect timeout"
    )
    first_token_timeout_s: float = Field(
        default=60.0, gt=0, le=3600, allow_inf_nan=False,
        description="seconds from forwarding to the first token before the rank counts as failed",
    )  # fmt: skip
    chunk_timeout_s: float = Field(
        default=30.0, gt=0, le=3600, allow_inf_nan=False,
        description="seconds between two chunks of a started stream before it is ended",
    )  # fmt: skip
    drain_timeout_s: float = Field(
        default=30.0, ge=0, le=3600, allow_inf_nan=False,
        description="on SIGTERM, seconds the streams in flight get to finish before they are ended",
    )  # fmt: skip
    no_rank_wait_s: float = Field(
        default=10.0, ge=0, le=3600, allow_inf_nan=False,
        description="once no rank is in rotation, seconds the queued requests wait for one to "
        "come back before they get 503 with Retry-After",
    )  # fmt: skip
    max_attempts: int = Field(
        default=3, ge=1, le=16, description="ranks a request may be sent to before it fails"
    )
    out: str | None = Field(
        default=None, description="folder for completions/ (the completion log) and ab/",
        json_schema_extra={"metavar": "DIR"},
    )  # fmt: skip
    rotate_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="completion-log part size in memory"
    )
    rotate_s: float = Field(
        default=10.0, gt=0, allow_inf_nan=False,
        description="completion-log part age at most: what a SIGKILL can lose (s)",
    )  # fmt: skip
    track: bool = Field(
        default=True, description="log the switchback to MLflow at shutdown",
        json_schema_extra={"flag": "--mlflow"},
    )  # fmt: skip
    relay_workers: int = Field(
        default=0, ge=0, le=64,
        description="relay worker processes sharing the port, which move the bytes and reach the "
        "decider through a proxy (0: the Protocol front beside the decider in one process)",
    )  # fmt: skip
    twins: bool = Field(
        default=True,
        description="run the live twins and the switchback's counterfactual (off: the "
        "twin-driven arms route at their start weight)",
    )
    twin_nice: int = Field(
        default=0, ge=0, le=19,
        description="the live twins' process's OS priority, this many steps below the gateway's "
        "(0: the same)",
    )  # fmt: skip

    @field_validator("rank_header", "estimator", "estimator_url", "history", "arms", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value

    @field_validator("ranks")
    @classmethod
    def _valid_ranks(cls, value: list[str]) -> list[str]:
        urls = [check_rank_url(u) for u in value]
        if len(set(urls)) != len(urls):
            raise ValueError("a rank URL is given twice")
        return urls

    @model_validator(mode="after")
    def _consistent(self) -> GatewaySettings:
        if self.rank_header is not None:
            if len(self.rank_urls) != 1:
                raise ValueError("header mode (rank_header) takes exactly one upstream URL")
            if self.group_size is None:
                raise ValueError("header mode needs group_size: the number of ranks upstream")
        elif self.group_size is not None and self.group_size != len(self.rank_urls):
            raise ValueError(
                f"group_size {self.group_size} differs from {len(self.rank_urls)} URLs"
            )
        if self.arms is not None and self.estimator_url is not None:
            raise ValueError("estimator_url applies to router; with arms give each its estimator")
        if self.arms is not None and any(not a.strip() for a in self.arms.split(",")):
            raise ValueError(f"arms {self.arms!r} has an empty spec: give comma-separated specs")
        if self.warmup >= self.switch_every_s:
            raise ValueError("warmup_s must be shorter than switch_every_s")
        return self

    @property
    def rank_urls(self) -> list[str]:
        """The ranks' base URLs, in rank order (header mode: the one upstream URL)."""
        return self.ranks

    @property
    def group(self) -> int:
        """G: the number of ranks."""
        return self.group_size or len(self.rank_urls)

    @property
    def warmup(self) -> float:
        """Seconds at the start of each switchback window left out of its figures."""
        return self.switch_every_s / 4 if self.warmup_s is None else self.warmup_s

    def sample_every(self, switching: bool) -> float:
        """Seconds between two regular samples: ``sample_s``; else 0.1 s while arms alternate
        (the switchback's imbalance average) and 1 s otherwise (a sample is a wake-up)."""
        if self.sample_s is not None:
            return self.sample_s
        return 0.1 if switching else 1.0

    def rank_url(self, rank: int) -> str:
        """Base URL that rank ``rank`` is reached at."""
        urls = self.rank_urls
        return urls[0] if self.rank_header is not None else urls[rank]

"""The gateway's event-loop lag: samples clamped at 0, the summary's percentiles, a loop that a
blocking callback holds shows the hold, and the metric is on the gateway's /metrics page."""

from __future__ import annotations

import asyncio
import time

import pytest
from prometheus_client import generate_latest

from balanceroute.serving.gateway.metrics import GatewayMetrics, LoopLag


def test_samples_are_clamped_at_zero_and_summarised():
    m = GatewayMetrics()
    lag = LoopLag(m.loop_lag, period_s=0.1, keep=100)
    for x in [-0.001] + [0.002] * 98 + [0.5]:
        lag.record(x)
    s = lag.summary()
    assert s["samples"] == 100 and s["max_s"] == 0.5 and s["window_max_s"] == 0.5
    assert s["p50_s"] == pytest.approx(0.002)
    assert 0.002 < s["p99_s"] <= 0.5
    assert min(lag.samples) == 0.0  # a timer run early counts as on time
    text = generate_latest(m.registry).decode()
    assert "balanceroute_gateway_loop_lag_seconds_count 100.0" in text
    assert 'balanceroute_gateway_loop_lag_seconds_bucket{le="1.0"} 100.0' in text
    assert 'balanceroute_gateway_loop_lag_seconds_bucket{le="0.3"} 99.0' in text


def test_the_window_is_bounded_but_the_max_is_since_start():
    lag = LoopLag(GatewayMetrics().loop_lag, keep=3)
    for x in (0.9, 0.1, 0.1, 0.1):
        lag.record(x)
    s = lag.summary()
    assert len(lag.samples) == 3 and s["window_max_s"] == pytest.approx(0.1)
    assert s["max_s"] == 0.9 and s["samples"] == 4


def test_an_empty_sampler_has_no_percentiles_and_a_bad_period_is_refused():
    lag = LoopLag(GatewayMetrics().loop_lag)
    assert lag.summary() == {"samples": 0, "max_s": 0.0, "period_s": lag.period_s}
    with pytest.raises(ValueError, match="period_s"):
        LoopLag(GatewayMetrics().loop_lag, period_s=0.0)


def test_a_callback_that_holds_the_loop_shows_as_lag():
    lag = LoopLag(GatewayMetrics().loop_lag, period_s=0.01)

    async def scenario() -> None:
        task = asyncio.create_task(lag.run())
        await asyncio.sleep(0.05)  # a few samples on an idle loop
        time.sleep(0.3)  # a callback that does not yield: the timer is due meanwhile
        while lag.count < 8:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    # the timer was due at most period_s after the hold began: it ran >= 0.29 s late
    assert lag.max_s >= 0.3 - 0.01 - 1e-6

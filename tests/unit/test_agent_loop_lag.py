"""The agent's event-loop lag watch observes how late its timer fired."""

from __future__ import annotations

import asyncio
import contextlib
import time

import pytest
from prometheus_client import CollectorRegistry

from modelswap_sidecar.agent.loop_lag import watch_loop_lag
from modelswap_sidecar.metrics import NodeMetrics, NodeSample


async def _watched(block_seconds: float) -> list[float]:
    seen: list[float] = []
    task = asyncio.create_task(watch_loop_lag(seen.append, period_seconds=0.01))
    await asyncio.sleep(0.05)
    time.sleep(block_seconds)  # noqa: ASYNC251 - the loop held on purpose: a timer fires late
    await asyncio.sleep(0.05)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    return seen


@pytest.mark.asyncio
async def test_a_blocked_loop_is_seen_late_by_about_the_block() -> None:
    seen = await _watched(0.2)
    assert len(seen) >= 5
    assert all(lag >= 0 for lag in seen)
    assert 0.15 <= max(seen) <= 2.0  # the block, give or take the timer's period and noise


@pytest.mark.asyncio
async def test_an_idle_loop_is_on_time_but_for_noise() -> None:
    seen = await _watched(0.0)
    assert sorted(seen)[len(seen) // 2] < 0.1  # the median sample: no block was made


def test_the_histogram_counts_each_sample_in_its_bucket() -> None:
    registry = CollectorRegistry()
    metrics = NodeMetrics(registry, NodeSample)
    for lag in (0.0005, 0.003, 0.03):
        metrics.loop_lag.observe(lag)
    value = registry.get_sample_value
    assert value("modelswap_agent_event_loop_lag_seconds_count") == 3
    assert value("modelswap_agent_event_loop_lag_seconds_bucket", {"le": "0.0025"}) == 1
    assert value("modelswap_agent_event_loop_lag_seconds_bucket", {"le": "0.005"}) == 2
    assert value("modelswap_agent_event_loop_lag_seconds_bucket", {"le": "0.025"}) == 2

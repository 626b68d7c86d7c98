"""Event-loop lag over a timed window, for the gateway bench's profile of its tail: the
agent's (its `modelswap_agent_event_loop_lag_seconds` histogram, read before and after the
window) and the load generator's own (the same watch, `agent/loop_lag.py`, run in this
process during the window). A loop late by some milliseconds holds every request of that
moment as long: the agent's for requests through the gateway only, the load generator's
for both paths alike."""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import AsyncIterator
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from modelswap_sidecar.agent.loop_lag import watch_loop_lag

AGENT_LAG = "modelswap_agent_event_loop_lag_seconds"
#: the lateness counted as a stall: the gateway's p99 target
STALL_SECONDS = 0.005


@dataclass(frozen=True)
class LagSummary:
    samples: int
    #: samples later than STALL_SECONDS
    stalls: int
    #: every sample was at most this late (from the agent's histogram: a bucket's bound,
    #: the last finite one with `beyond` when a sample went past it)
    worst_seconds: float
    total_seconds: float
    beyond: bool = False

    def words(self) -> str:
        worst = f"{'over' if self.beyond else 'at most'} {self.worst_seconds * 1e3:.1f} ms"
        return (
            f"{self.stalls} of {self.samples} timers more than {STALL_SECONDS * 1e3:.0f} ms "
            f"late (the worst {worst}; {self.total_seconds * 1e3:.0f} ms late in all)"
        )


@dataclass(frozen=True)
class Histogram:
    #: cumulative count by upper bound (math.inf for every sample)
    buckets: dict[float, float]
    sum_seconds: float


def parse_histogram(metrics_text: str, name: str = AGENT_LAG) -> Histogram:
    """`name`'s buckets and sum from a Prometheus text exposition (an unlabelled histogram)."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name == name:
            buckets = {
                float(s.labels["le"]): s.value for s in family.samples if s.name == f"{name}_bucket"
            }
            total = next(s.value for s in family.samples if s.name == f"{name}_sum")
            return Histogram(buckets, total)
    raise ValueError(f"no {name} histogram in the metrics")


def between(before: Histogram, after: Histogram) -> LagSummary:
    """What the histogram counted between two readings."""
    delta = {b: after.buckets[b] - before.buckets.get(b, 0.0) for b in sorted(after.buckets)}
    samples = delta[math.inf]
    within = max((c for b, c in delta.items() if b <= STALL_SECONDS), default=0.0)
    worst = min(b for b, c in delta.items() if c == samples) if samples else 0.0
    beyond = math.isinf(worst)
    return LagSummary(
        samples=int(samples),
        stalls=int(samples - within),
        worst_seconds=max(b for b in delta if not math.isinf(b)) if beyond else worst,
        total_seconds=after.sum_seconds - before.sum_seconds,
        beyond=beyond,
    )


def of_samples(samples: list[float]) -> LagSummary:
    return LagSummary(
        samples=len(samples),
        stalls=sum(1 for s in samples if s > STALL_SECONDS),
        worst_seconds=max(samples, default=0.0),
        total_seconds=sum(samples),
    )


async def _agent_histogram(metrics_url: str) -> Histogram:
    response = await asyncio.to_thread(httpx.get, metrics_url, trust_env=False, timeout=30)
    response.raise_for_status()
    return parse_histogram(response.text)


@contextlib.asynccontextmanager
async def lag_window(metrics_url: str) -> AsyncIterator[dict[str, LagSummary]]:
    """Yields a dict that holds, once the block is done, "agent" and "load generator"."""
    found: dict[str, LagSummary] = {}
    before = await _agent_histogram(metrics_url)
    own: list[float] = []
    watch = asyncio.create_task(watch_loop_lag(own.append))
    try:
        yield found
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch
    found["agent"] = between(before, await _agent_histogram(metrics_url))
    found["load generator"] = of_samples(own)

"""How late the agent's event loop runs: a timer every `period_seconds`, and how much later
than due it fired, observed as `modelswap_agent_event_loop_lag_seconds`.

Every gateway request and control call waits for this loop. A loop that is late by some
milliseconds (a blocking call, a garbage collection, the process waiting for a CPU on a
busy machine) adds them to every request of that moment, so the histogram's tail is what
to read beside the gateway's own latency tail. A stall shorter than the period is seen
when the timer falls in it: the count of late samples understates short stalls, their
sizes do not.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

#: 50 timers a second: a few microseconds of CPU each, and a stall of 5 ms or more is
#: caught at least a quarter of the time.
LAG_PERIOD_SECONDS = 0.02


async def watch_loop_lag(
    observe: Callable[[float], None],
    period_seconds: float = LAG_PERIOD_SECONDS,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Until cancelled: sleep `period_seconds`, then `observe` how late the wake-up was (0
    or more). `clock` is a fine one: uvloop's own `loop.time()` counts whole milliseconds."""
    while True:
        due = clock() + period_seconds
        await asyncio.sleep(period_seconds)
        observe(max(0.0, clock() - due))

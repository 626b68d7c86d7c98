"""How often a GPU's busy models alone need more HBM than it has.

A model is busy while it has a request waiting or in flight. A sharing policy may swap
out only models that are not busy, unless it stops a request mid-way, which none of the
simulated policies does. So where the busy models of a GPU need more bytes than its
budget, some request on it waits for another model's requests to finish, whatever the
policy. `over_budget_arrivals` counts the requests that arrive at such a moment, the
arriving request's own model counted busy, in a given run's timing (the dedicated run's:
requests served as soon as they come, so the busy set is the traffic's own). It is an
indicator of the working set, not a strict bound: a sharing run's own waits change its
busy sets.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from modelswap_sidecar.simulate.traces import Trace


def over_budget_arrivals(
    trace: Trace,
    *,
    service_seconds: Sequence[float],
    waits_seconds: Sequence[float],
    model_bytes: Sequence[int],
    assignment: Sequence[int],
    budget_bytes: Sequence[int],
) -> int:
    """The requests (of `trace`, arrivals sorted) that arrive while the busy models of
    their GPU (`assignment`: GPU per model), theirs included, need more than that GPU's
    `budget_bytes`. Request k keeps its model busy from its arrival until its wait
    (`waits_seconds[k]`) and its service (`service_seconds[k]`) are over."""
    busy_requests = [0] * len(model_bytes)
    busy_bytes = [0] * len(budget_bytes)
    ends: list[tuple[float, int]] = []  # (when a request ends, its model)
    over = 0
    for k, (arrival, model) in enumerate(
        zip(trace.arrival_seconds, trace.model_index, strict=True)
    ):
        # a request ending at this very instant frees its model before this one counts
        while ends and ends[0][0] <= arrival:
            _, done = heapq.heappop(ends)
            busy_requests[done] -= 1
            if not busy_requests[done]:
                busy_bytes[assignment[done]] -= model_bytes[done]
        gpu = assignment[model]
        if not busy_requests[model]:
            busy_bytes[gpu] += model_bytes[model]
        busy_requests[model] += 1
        if busy_bytes[gpu] > budget_bytes[gpu]:
            over += 1
        heapq.heappush(ends, (arrival + waits_seconds[k] + service_seconds[k], model))
    return over

"""Which GPU hosts each model: a pure, greedy, load-balancing assignment.

Models go in order of offered load (request-seconds in the trace), heaviest first, each to
the GPU where the sum of its load share and its byte share is lowest, among the GPUs
where it still fits the placement rule (DESIGN.md §5): each GPU's budget holds its
pinned models plus its largest unpinned one, and its host store holds every hosted
model's host bytes. Every sharing policy of a run gets the same assignment.

The operator's planner does not know request rates; a user sizing a cluster does, and
would spread the hot models (node or GPU selectors), so the simulator does too.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


def assign(
    hbm_bytes: Sequence[int],
    host_bytes: Sequence[int],
    pinned: Sequence[bool],
    loads: Sequence[float],
    gpus: int,
    *,
    budget_bytes: Callable[[int], int],
    loaded_overhead_bytes: int,
    host_store_bytes: int,
) -> list[int] | None:
    """GPU index per model, or None when some model fits no GPU."""
    count = len(hbm_bytes)
    total_load = sum(loads) or 1.0
    total_bytes = sum(hbm_bytes) or 1
    load = [0.0] * gpus
    size = [0] * gpus
    host = [0] * gpus
    hosted = [0] * gpus
    pinned_bytes = [0] * gpus
    largest = [0] * gpus
    out = [-1] * count
    for m in sorted(range(count), key=lambda i: (-loads[i], -hbm_bytes[i], i)):
        need = hbm_bytes[m] + loaded_overhead_bytes
        best: tuple[float, int] | None = None
        for g in range(gpus):
            if host[g] + host_bytes[m] > host_store_bytes:
                continue
            pins = pinned_bytes[g] + (need if pinned[m] else 0)
            big = largest[g] if pinned[m] else max(largest[g], need)
            if pins + big > budget_bytes(hosted[g] + 1):
                continue
            score = (load[g] + loads[m]) / total_load + (size[g] + hbm_bytes[m]) / total_bytes
            if best is None or score < best[0]:
                best = (score, g)
        if best is None:
            return None
        g = best[1]
        out[m] = g
        load[g] += loads[m]
        size[g] += hbm_bytes[m]
        host[g] += host_bytes[m]
        hosted[g] += 1
        if pinned[m]:
            pinned_bytes[g] += need
        else:
            largest[g] = max(largest[g], need)
    return out

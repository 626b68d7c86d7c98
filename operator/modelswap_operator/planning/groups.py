"""The GPUs every model with one `PlacementKey` may use, and why a model would not fit
even an empty one of them (the reason and the spec field at fault)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from modelswap_operator.planning.capacity import Demand
from modelswap_operator.planning.eligibility import (
    GpuSlot,
    Ineligible,
    NodeView,
    PlacementKey,
    eligible_gpus,
    show_bytes,
)
from modelswap_operator.planning.results import UnplacedReason


@dataclass(frozen=True, kw_only=True)
class Group:
    """The GPUs every model with one `PlacementKey` may use."""

    gpus: tuple[GpuSlot, ...]
    indices: frozenset[int]
    #: (budget - overhead, host capacity) pairs no other eligible GPU beats in both
    frontier: tuple[tuple[int, int], ...]


def group_of(key: PlacementKey, nodes: Sequence[NodeView]) -> Group | Ineligible:
    gpus = eligible_gpus(key, nodes)
    if isinstance(gpus, Ineligible):
        return gpus
    points = sorted(
        {(g.budget_bytes - g.overhead_bytes, g.host_capacity_bytes) for g in gpus}, reverse=True
    )
    frontier: list[tuple[int, int]] = []
    for room, host in points:  # room descending: keep a point only if its host beats all so far
        if not frontier or host > frontier[-1][1]:
            frontier.append((room, host))
    return Group(gpus=gpus, indices=frozenset(g.index for g in gpus), frontier=tuple(frontier))


def size_problem(demand: Demand, group: Group) -> Ineligible | None:
    """Why the model would not fit even an empty eligible GPU, or None when it would."""
    if any(demand.hbm_bytes <= room and demand.host_bytes <= host for room, host in group.frontier):
        return None
    hbm_ok = [g for g in group.gpus if demand.hbm_bytes + g.overhead_bytes <= g.budget_bytes]
    if not hbm_ok:
        return _exceeds_gpu_budget(demand, group.gpus)
    return _exceeds_host_store(demand, hbm_ok)


def _exceeds_gpu_budget(demand: Demand, gpus: Sequence[GpuSlot]) -> Ineligible:
    weights_fit = any(demand.weights_bytes + g.overhead_bytes <= g.budget_bytes for g in gpus)
    largest = max(gpus, key=lambda g: (g.budget_bytes - g.overhead_bytes, -g.index))
    return Ineligible(
        reason=UnplacedReason.EXCEEDS_GPU_BUDGET,
        field="spec.model.kvCacheBytes" if weights_fit else "spec.model.weightsBytes",
        message=f"needs {show_bytes(demand.hbm_bytes)} of HBM (weights "
        f"{show_bytes(demand.weights_bytes)} + KV cache {show_bytes(demand.kv_cache_bytes)}) "
        f"plus {show_bytes(largest.overhead_bytes)} per-process overhead; the largest budget "
        f"of the {len(gpus)} eligible GPUs is {show_bytes(largest.budget_bytes)} on {largest} "
        f"(HBM {show_bytes(largest.hbm_total_bytes)} - reserved "
        f"{show_bytes(largest.hbm_reserved_bytes)})",
    )


def _exceeds_host_store(demand: Demand, gpus: Sequence[GpuSlot]) -> Ineligible:
    largest = max(gpus, key=lambda g: (g.host_capacity_bytes, -g.index))
    capacity = largest.host_capacity_bytes
    if demand.weights_bytes > capacity:
        field = "spec.model.weightsBytes"
    elif demand.weights_bytes + demand.kv_host_bytes > capacity:
        field = "spec.kvCache.hostBytes"
    else:
        field = "spec.swapPolicy.kv"  # the preserved KV cache tips it over
    return Ineligible(
        reason=UnplacedReason.EXCEEDS_HOST_STORE,
        field=field,
        message=f"needs {show_bytes(demand.host_bytes)} of host store (weights "
        f"{show_bytes(demand.weights_bytes)} + preserved KV cache "
        f"{show_bytes(demand.preserved_kv_bytes)} + KV host tier "
        f"{show_bytes(demand.kv_host_bytes)}); the largest host store of an eligible GPU with "
        f"room for it in HBM is {show_bytes(capacity)} on {largest}",
    )

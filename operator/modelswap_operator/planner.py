"""The placement planner: which GPU of which live node each ModelDeployment goes to.

`plan(swap_nodes, deployments, assignments, defaults) -> Plan` is pure: no API calls, no
clocks, no randomness; the same inputs in any order give the same plan. The actuator
carries the plan out.

Rules (DESIGN §5):

- A model's policy is `effective_policy(spec, defaults)`; an invalid one makes the model
  unplaceable (`PolicyInvalid`, naming the field of the first error).
- A model may use a GPU when its node's labels include `spec.placement.nodeSelector`, every
  NoSchedule/NoExecute taint of the node is tolerated (Kubernetes semantics; PreferNoSchedule
  is ignored), and the GPU matches `gpuSelector` (product exactly, `minHbmBytes` ≤ HBM total).
- HBM bytes = weightsBytes + kvCacheBytes; host bytes = weightsBytes + kvCacheBytes when
  `kv: preserve` + kvCache.hostBytes. A GPU holds a set of models when Σ pinned HBM + the
  largest unpinned HBM + per-process overhead x models ≤ HBM total - reserved, and Σ host
  bytes ≤ its host-store capacity (`planning.capacity`).
- A model that would not fit even an empty eligible GPU is unplaced with the reason and the
  spec field at fault; one that would, but finds no room now, is `InsufficientCapacity`.
- Existing assignments stay unless they must move: the node is absent (`NodeLost`), the GPU
  is (`GpuLost`), selectors (`SelectorChanged`) or taints (`TaintNotTolerated`) no longer
  allow it, or its GPU can no longer hold everything kept there (`NoLongerFits`: models are
  kept in placement order, so the lowest-priority ones move first).
- Kept models are accounted first; then new and moving models are placed in placement
  order (pinned first, priority descending, larger HBM first, then UID), each on the best
  fitting GPU (`planning.capacity.BestFit`).

Re-planning with a plan's own assignments keeps every placed model where it is: a plan
never over-commits a GPU, so every kept set still fits.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from modelswap_api.errors import PolicyError
from modelswap_api.models import (
    GatewayPolicy,
    KvCachePolicy,
    ModelDeployment,
    ModelDeploymentSpec,
    SwapNode,
    SwapPolicy,
)
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_operator.planning.capacity import BestFit, Demand, Ledger, demand_of
from modelswap_operator.planning.eligibility import (
    GpuSlot,
    Ineligible,
    NodeView,
    PlacementKey,
    eligible_gpus,
    node_views,
    selects,
    show_bytes,
    untolerated,
)
from modelswap_operator.planning.results import (
    Assignment,
    Placed,
    PlacedReason,
    Plan,
    Unplaced,
    UnplacedReason,
)

__all__ = [
    "Assignment",
    "Placed",
    "PlacedReason",
    "Plan",
    "Unplaced",
    "UnplacedReason",
    "clear_policy_cache",
    "plan",
]


@dataclass(frozen=True, kw_only=True)
class _Group:
    """The GPUs every model with one `PlacementKey` may use."""

    gpus: tuple[GpuSlot, ...]
    indices: frozenset[int]
    #: (budget - overhead, host capacity) pairs no other eligible GPU beats in both
    frontier: tuple[tuple[int, int], ...]


@dataclass(frozen=True, kw_only=True)
class _Candidate:
    """A model that fits some eligible GPU when that GPU is empty."""

    deployment: ModelDeployment
    policy: EffectivePolicy
    demand: Demand
    key: PlacementKey


@dataclass(frozen=True, kw_only=True)
class _Move:
    source: Assignment
    reason: PlacedReason
    why: str


def plan(
    swap_nodes: Sequence[SwapNode],
    deployments: Sequence[ModelDeployment],
    assignments: Mapping[str, Assignment],
    defaults: Mapping[str, Any],
) -> Plan:
    """Place every ModelDeployment on a GPU of a live SwapNode, or say why it cannot be.

    `swap_nodes`: the live nodes only; `assignments`: UID → where each model is now;
    `defaults`: the cluster policy defaults (the shape of `BUILTIN_DEFAULTS`).
    ValueError when two deployments share a UID or two SwapNodes a name.
    """
    return plan_views(node_views(swap_nodes), deployments, assignments, defaults)


def plan_views(
    nodes: Sequence[NodeView],
    deployments: Sequence[ModelDeployment],
    assignments: Mapping[str, Assignment],
    defaults: Mapping[str, Any],
) -> Plan:
    """`plan` over the nodes as placement sees them (`node_views`): all of a SwapNode
    that a plan depends on, so equal views with the same other inputs plan the same."""
    unplaced: dict[str, Unplaced] = {}
    groups: dict[PlacementKey, _Group | Ineligible] = {}
    candidates: list[_Candidate] = []
    for deployment, policy in _policies(deployments, defaults):
        uid = _uid(deployment)
        if isinstance(policy, PolicyError):
            unplaced[uid] = _policy_invalid(uid, policy)
            continue
        key = PlacementKey.of(deployment.spec.placement)
        if key not in groups:
            groups[key] = _group(key, nodes)
        group = groups[key]
        demand = demand_of(uid, deployment.spec.model, policy)
        problem = group if isinstance(group, Ineligible) else _size_problem(demand, group)
        if problem is not None:
            unplaced[uid] = Unplaced(
                uid=uid,
                reason=problem.reason,
                field=problem.field,
                message=problem.message,
                policy=policy,
            )
            continue
        candidates.append(_Candidate(deployment=deployment, policy=policy, demand=demand, key=key))
    usable = {k: g for k, g in groups.items() if isinstance(g, _Group)}
    ledger = Ledger([gpu for node in nodes for gpu in node.gpus])
    placed, to_place = _keep(candidates, assignments, nodes, usable, ledger)
    fitter = BestFit(ledger, {key: group.gpus for key, group in usable.items()})
    placed.update(_place(to_place, fitter, ledger, usable, unplaced))
    return Plan(
        placed=MappingProxyType(dict(sorted(placed.items()))),
        unplaced=MappingProxyType(dict(sorted(unplaced.items()))),
    )


def _uid(deployment: ModelDeployment) -> str:
    return str(deployment.metadata["uid"])


def _policies(
    deployments: Sequence[ModelDeployment], defaults: Mapping[str, Any]
) -> list[tuple[ModelDeployment, EffectivePolicy | PolicyError]]:
    """Each deployment (by UID) with its effective policy, or the error that refused it."""
    ordered = sorted(deployments, key=_uid)
    uids = [_uid(d) for d in ordered]
    if len(set(uids)) != len(uids):
        raise ValueError("ModelDeployment UIDs must be unique")
    defaults_json = json.dumps(defaults, sort_keys=True, default=repr)
    out: list[tuple[ModelDeployment, EffectivePolicy | PolicyError]] = []
    for deployment in ordered:
        spec = deployment.spec
        query = _PolicyQuery(
            defaults_json, spec.swap_policy, spec.kv_cache, spec.gateway, spec, defaults
        )
        out.append((deployment, _effective_policy(query)))
    return out


@dataclass(frozen=True)
class _PolicyQuery:
    """An `effective_policy` call, compared and hashed by what that function reads: the
    defaults and the spec's policy sections (if it ever reads more, this must grow)."""

    defaults_json: str
    swap_policy: SwapPolicy | None
    kv_cache: KvCachePolicy | None
    gateway: GatewayPolicy | None
    spec: ModelDeploymentSpec = field(compare=False, hash=False)
    defaults: Mapping[str, Any] = field(compare=False, hash=False)


@functools.lru_cache(maxsize=8192)
def _effective_policy(query: _PolicyQuery) -> EffectivePolicy | PolicyError:
    """`effective_policy`, remembered across calls: it validates the defaults and evaluates
    the CEL rules every time (about 15 ms on a slow CPU), and a cluster has far fewer
    distinct policies than models. Remembering a pure function's results keeps `plan` pure."""
    try:
        return effective_policy(query.spec.to_dict(), query.defaults)
    except PolicyError as e:
        return e


def clear_policy_cache() -> None:
    """Forget remembered effective policies (a benchmark times a first plan this way)."""
    _effective_policy.cache_clear()


def _policy_invalid(uid: str, error: PolicyError) -> Unplaced:
    first = error.errors[0] if error.errors else None
    return Unplaced(
        uid=uid,
        reason=UnplacedReason.POLICY_INVALID,
        field=first.path if first else None,
        message=str(error),
        policy=None,
    )


def _group(key: PlacementKey, nodes: Sequence[NodeView]) -> _Group | Ineligible:
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
    return _Group(gpus=gpus, indices=frozenset(g.index for g in gpus), frontier=tuple(frontier))


def _size_problem(demand: Demand, group: _Group) -> Ineligible | None:
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


def _keep(
    candidates: Sequence[_Candidate],
    assignments: Mapping[str, Assignment],
    nodes: Sequence[NodeView],
    groups: Mapping[PlacementKey, _Group],
    ledger: Ledger,
) -> tuple[dict[str, Placed], list[tuple[_Candidate, _Move | None]]]:
    """Account the models that stay where they are; return them and the models to place."""
    slots = {(gpu.node, gpu.uuid): gpu for node in nodes for gpu in node.gpus}
    by_name = {node.name: node for node in nodes}
    staying: dict[int, list[_Candidate]] = {}
    to_place: list[tuple[_Candidate, _Move | None]] = []
    for candidate in candidates:
        source = assignments.get(candidate.demand.uid)
        if source is None:
            to_place.append((candidate, None))
            continue
        gpu = slots.get((source.node, source.gpu))
        move = _must_move(candidate, source, by_name, gpu, groups[candidate.key])
        if move is not None or gpu is None:
            to_place.append((candidate, move))
        else:
            staying.setdefault(gpu.index, []).append(candidate)
    placed: dict[str, Placed] = {}
    for index in sorted(staying):
        for candidate in sorted(staying[index], key=lambda c: c.demand.order):
            gpu = ledger.slots[index]
            source = Assignment(gpu.node, gpu.uuid)
            if ledger.room_after(index, candidate.demand) is None:
                why = _no_longer_fits(ledger, index)
                to_place.append(
                    (candidate, _Move(source=source, reason=PlacedReason.NO_LONGER_FITS, why=why))
                )
                continue
            ledger.add(index, candidate.demand)
            placed[candidate.demand.uid] = _placed(
                candidate, gpu, PlacedReason.KEPT, None, f"stays on {source}"
            )
    return placed, to_place


def _must_move(
    candidate: _Candidate,
    source: Assignment,
    nodes: Mapping[str, NodeView],
    gpu: GpuSlot | None,
    group: _Group,
) -> _Move | None:
    """Why the model cannot stay on its assigned GPU whatever else is there, or None."""
    node = nodes.get(source.node)
    if node is None:
        why = f"node {source.node} is gone (no live SwapNode)"
        return _Move(source=source, reason=PlacedReason.NODE_LOST, why=why)
    if gpu is None:
        why = f"node {source.node} no longer reports GPU {source.gpu}"
        return _Move(source=source, reason=PlacedReason.GPU_LOST, why=why)
    if gpu.index in group.indices:
        return None
    key = candidate.key
    if not selects(key, node.labels):
        why = f"node {node.name} no longer matches spec.placement.nodeSelector"
        return _Move(source=source, reason=PlacedReason.SELECTOR_CHANGED, why=why)
    taints = untolerated(key, node)
    if taints:
        shown = ", ".join(f"{t.key}:{t.effect}" for t in taints)
        why = f"node {node.name} has taints spec.placement.tolerations does not tolerate: {shown}"
        return _Move(source=source, reason=PlacedReason.TAINT_NOT_TOLERATED, why=why)
    # Node selector and taints allow it, so the GPU selector no longer does.
    why = (
        f"GPU {gpu} ({gpu.product}, {show_bytes(gpu.hbm_total_bytes)} HBM) no longer "
        "matches spec.placement.gpuSelector"
    )
    return _Move(source=source, reason=PlacedReason.SELECTOR_CHANGED, why=why)


def _no_longer_fits(ledger: Ledger, index: int) -> str:
    gpu = ledger.slots[index]
    return (
        f"GPU {gpu} cannot hold it beside the {ledger.models[index]} higher-ranked models kept "
        f"there ({show_bytes(ledger.free_hbm_bytes(index))} HBM and "
        f"{show_bytes(ledger.free_host_bytes(index))} host store left of a "
        f"{show_bytes(gpu.budget_bytes)} budget and {show_bytes(gpu.host_capacity_bytes)} store)"
    )


def _place(
    to_place: list[tuple[_Candidate, _Move | None]],
    fitter: BestFit,
    ledger: Ledger,
    groups: Mapping[PlacementKey, _Group],
    unplaced: dict[str, Unplaced],
) -> dict[str, Placed]:
    """Place new and moving models in placement order; the rest become InsufficientCapacity."""
    ordered = sorted(to_place, key=lambda pair: pair[0].demand.order)
    floors = _suffix_min_host_bytes([c.demand for c, _ in ordered])
    fitter.used((i for i, models in enumerate(ledger.models) if models), floors[0])
    placed: dict[str, Placed] = {}
    crowded: list[tuple[_Candidate, _Move | None]] = []
    for position, (candidate, move) in enumerate(ordered):
        index = fitter.best(candidate.key, candidate.demand, floors[position])
        if index is None:
            crowded.append((candidate, move))
            continue
        fitter.add(index, candidate.demand, floors[position + 1])
        gpu = ledger.slots[index]
        placed[candidate.demand.uid] = _placed_new(candidate, gpu, move, ledger)
    roomiest: dict[PlacementKey, tuple[GpuSlot, GpuSlot]] = {}
    for candidate, move in crowded:
        if candidate.key not in roomiest:
            roomiest[candidate.key] = _roomiest(groups[candidate.key].gpus, ledger)
        unplaced[candidate.demand.uid] = _crowded_out(
            candidate, move, ledger, roomiest[candidate.key], len(groups[candidate.key].gpus)
        )
    return placed


def _suffix_min_host_bytes(demands: Sequence[Demand]) -> list[int]:
    """floors[i]: the smallest host bytes among demands[i:]; past the end, no limit."""
    floors = [2**63] * (len(demands) + 1)
    for i in range(len(demands) - 1, -1, -1):
        floors[i] = min(floors[i + 1], demands[i].host_bytes)
    return floors


def _placed(
    candidate: _Candidate,
    gpu: GpuSlot,
    reason: PlacedReason,
    moved_from: Assignment | None,
    message: str,
) -> Placed:
    return Placed(
        uid=candidate.demand.uid,
        node=gpu.node,
        gpu=gpu.uuid,
        policy=candidate.policy,
        moved_from=moved_from,
        reason=reason,
        message=message,
    )


def _placed_new(candidate: _Candidate, gpu: GpuSlot, move: _Move | None, ledger: Ledger) -> Placed:
    left = (
        f"best fit, leaving {show_bytes(ledger.free_hbm_bytes(gpu.index))} HBM and "
        f"{show_bytes(ledger.free_host_bytes(gpu.index))} host store free there at the time"
    )
    if move is None:
        return _placed(candidate, gpu, PlacedReason.PLACED, None, f"placed on {gpu}; {left}")
    message = f"moved from {move.source} to {gpu}: {move.why}; {left}"
    return _placed(candidate, gpu, move.reason, move.source, message)


def _roomiest(gpus: Sequence[GpuSlot], ledger: Ledger) -> tuple[GpuSlot, GpuSlot]:
    """The GPUs with the most free HBM and the most free host store (first by slot order)."""
    most_hbm = max(gpus, key=lambda g: (ledger.free_hbm_bytes(g.index), -g.index))
    most_host = max(gpus, key=lambda g: (ledger.free_host_bytes(g.index), -g.index))
    return most_hbm, most_host


def _crowded_out(
    candidate: _Candidate,
    move: _Move | None,
    ledger: Ledger,
    roomiest: tuple[GpuSlot, GpuSlot],
    eligible: int,
) -> Unplaced:
    demand = candidate.demand
    most_hbm, most_host = roomiest
    message = (
        f"no eligible GPU has room now for {show_bytes(demand.hbm_bytes)} of HBM plus the "
        f"per-process overhead and {show_bytes(demand.host_bytes)} of host store; the most "
        f"free HBM is {show_bytes(ledger.free_hbm_bytes(most_hbm.index))} on {most_hbm}, the "
        f"most free host store {show_bytes(ledger.free_host_bytes(most_host.index))} on "
        f"{most_host} ({eligible} eligible GPUs)"
    )
    if move is not None:
        message += f"; it had to leave {move.source}: {move.why}"
    return Unplaced(
        uid=demand.uid,
        reason=UnplacedReason.INSUFFICIENT_CAPACITY,
        field="spec.model.weightsBytes",
        message=message,
        policy=candidate.policy,
    )

"""The placement planner: which GPU of which live node each ModelDeployment goes to.

`plan(swap_nodes, deployments, assignments, defaults) -> Plan` is pure: no API calls, no
clocks, no randomness; the same inputs in any order give the same plan. The reconciler's
`placing` turns it into each model's verdict; pushes and statuses carry it out.

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

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from modelswap_api.errors import PolicyError
from modelswap_api.models import ModelDeployment, SwapNode
from modelswap_api.policy import EffectivePolicy
from modelswap_operator.planning.capacity import BestFit, Demand, Ledger, demand_of
from modelswap_operator.planning.eligibility import (
    GpuSlot,
    Ineligible,
    NodeView,
    PlacementKey,
    node_views,
    selects,
    show_bytes,
    untolerated,
)
from modelswap_operator.planning.groups import Group, group_of, size_problem
from modelswap_operator.planning.policies import (
    clear_policy_cache,
    policies,
    policy_invalid,
    uid_of,
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
    groups: dict[PlacementKey, Group | Ineligible] = {}
    candidates: list[_Candidate] = []
    for deployment, policy in policies(deployments, defaults):
        uid = uid_of(deployment)
        if isinstance(policy, PolicyError):
            unplaced[uid] = policy_invalid(uid, policy)
            continue
        key = PlacementKey.of(deployment.spec.placement)
        if key not in groups:
            groups[key] = group_of(key, nodes)
        group = groups[key]
        demand = demand_of(uid, deployment.spec.model, policy)
        problem = group if isinstance(group, Ineligible) else size_problem(demand, group)
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
    usable = {k: g for k, g in groups.items() if isinstance(g, Group)}
    ledger = Ledger([gpu for node in nodes for gpu in node.gpus])
    placed, to_place = _keep(candidates, assignments, nodes, usable, ledger)
    fitter = BestFit(ledger, {key: group.gpus for key, group in usable.items()})
    placed.update(_place(to_place, fitter, ledger, usable, unplaced))
    return Plan(
        placed=MappingProxyType(dict(sorted(placed.items()))),
        unplaced=MappingProxyType(dict(sorted(unplaced.items()))),
    )


def _keep(
    candidates: Sequence[_Candidate],
    assignments: Mapping[str, Assignment],
    nodes: Sequence[NodeView],
    groups: Mapping[PlacementKey, Group],
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
    group: Group,
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
    groups: Mapping[PlacementKey, Group],
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

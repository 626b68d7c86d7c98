"""Property tests of the placement planner (hypothesis, derandomized: the same cases every run).

Checked against the plan itself, with the rules recomputed here independently: no GPU is
over-committed (HBM or host store), no model sits where its selectors or taints forbid,
every deployment is placed or unplaced exactly once, input order does not matter, and
re-planning with the plan's own assignments keeps every placed model where it is.
"""

from __future__ import annotations

import random
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import GpuStatus, ModelDeployment, SwapNode, Taint, Toleration
from modelswap_operator.planner import Assignment, PlacedReason, Plan, plan

pytestmark = pytest.mark.timeout(120)

GIB = 1 << 30
CASES = settings(
    max_examples=100,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TAINTS = [
    {"key": "dedicated", "value": "a", "effect": "NoSchedule"},
    {"key": "dedicated", "value": "b", "effect": "NoExecute"},
    {"key": "soft", "effect": "PreferNoSchedule"},
]
TOLERATIONS = [
    {"key": "dedicated", "operator": "Equal", "value": "a"},
    {"key": "dedicated", "operator": "Exists", "effect": "NoExecute"},
    {"operator": "Exists"},
]


@st.composite
def gpus(draw: st.DrawFn, node: str) -> list[dict[str, Any]]:
    count = draw(st.integers(0, 3))
    return [
        {
            "uuid": f"{node}-gpu{i}",
            "ordinal": i,
            "product": draw(st.sampled_from(["H100", "H200"])),
            "hbmTotalBytes": draw(st.sampled_from([24, 40, 80])) * GIB,
            "hbmReservedBytes": draw(st.integers(0, 4)) * GIB,
            "perProcessOverheadBytes": draw(st.sampled_from([0, GIB // 2, 2 * GIB])),
            "hostStoreCapacityBytes": draw(st.sampled_from([16, 64, 256])) * GIB,
        }
        for i in range(count)
    ]


@st.composite
def swap_nodes(draw: st.DrawFn) -> list[SwapNode]:
    nodes = []
    for n in range(draw(st.integers(1, 4))):
        name = f"node-{n}"
        status = {
            "gpus": draw(gpus(name)),
            "nodeLabels": {"pool": draw(st.sampled_from(["a", "b"]))},
            "nodeTaints": draw(st.lists(st.sampled_from(TAINTS), max_size=2, unique_by=str)),
        }
        nodes.append(SwapNode.from_dict({"metadata": {"name": name}, "status": status}))
    return nodes


@st.composite
def placements(draw: st.DrawFn) -> dict[str, Any]:
    placement: dict[str, Any] = {}
    if draw(st.booleans()):
        placement["nodeSelector"] = {"pool": draw(st.sampled_from(["a", "b"]))}
    tolerations = draw(st.lists(st.sampled_from(TOLERATIONS), max_size=2, unique_by=str))
    if tolerations:
        placement["tolerations"] = tolerations
    if draw(st.integers(0, 3)) == 0:
        placement["gpuSelector"] = draw(
            st.sampled_from([{"product": "H200"}, {"minHbmBytes": "40Gi"}])
        )
    return placement


@st.composite
def deployments(draw: st.DrawFn) -> list[ModelDeployment]:
    out = []
    for i in range(draw(st.integers(0, 14))):
        spec: dict[str, Any] = {
            "model": {
                "source": {"uri": f"/models/{i}"},
                "weightsBytes": f"{draw(st.integers(1, 40))}Gi",
            },
            "swapPolicy": {
                "priority": draw(st.integers(0, 3)),
                "pinned": draw(st.integers(0, 3)) == 0,
                "kv": draw(st.sampled_from(["discard", "preserve"])),
            },
            "kvCache": {"hostBytes": draw(st.sampled_from(["1Gi", "4Gi"]))},
        }
        kv_gib = draw(st.integers(0, 8))
        if kv_gib:
            spec["model"]["kvCacheBytes"] = f"{kv_gib}Gi"
        placement = draw(placements())
        if placement:
            spec["placement"] = placement
        metadata = {"uid": f"uid-{i:02d}", "name": f"m{i}", "namespace": "ns"}
        out.append(ModelDeployment.from_dict({"metadata": metadata, "spec": spec}))
    return out


@st.composite
def worlds(
    draw: st.DrawFn,
) -> tuple[list[SwapNode], list[ModelDeployment], dict[str, Assignment]]:
    nodes = draw(swap_nodes())
    models = draw(deployments())
    places = [(n.metadata["name"], g.uuid) for n in nodes for g in (n.status.gpus or ())]  # type: ignore[union-attr]
    places += [("node-gone", "node-gone-gpu0"), ("node-0", "node-0-gpu9")]
    assignments = {}
    for m in models:
        if draw(st.booleans()):
            node, gpu = draw(st.sampled_from(places))
            assignments[m.metadata["uid"]] = Assignment(node, gpu)
    return nodes, models, assignments


def run(nodes: list[SwapNode], models: list[ModelDeployment], where: dict[str, Assignment]) -> Plan:
    return plan(nodes, models, where, BUILTIN_DEFAULTS)


# --- the rules, recomputed here -----------------------------------------------------------


@dataclass
class Load:
    pinned: int = 0
    largest_unpinned: int = 0
    models: int = 0
    host: int = 0


def _gpus_by_place(nodes: list[SwapNode]) -> dict[tuple[str, str], tuple[SwapNode, GpuStatus]]:
    return {
        (n.metadata["name"], g.uuid): (n, g)
        for n in nodes
        for g in ((n.status.gpus if n.status else None) or ())
    }


def _tolerates(tol: Toleration, taint: Taint) -> bool:
    if tol.effect not in (None, "", taint.effect):
        return False
    if tol.key not in (None, "", taint.key):
        return False
    return tol.operator == "Exists" or (tol.value or "") == (taint.value or "")


def _allowed(model: ModelDeployment, node: SwapNode, gpu: GpuStatus) -> bool:
    placement = model.spec.placement
    labels = (node.status.node_labels if node.status else None) or {}
    taints = (node.status.node_taints if node.status else None) or ()
    selector = (placement.node_selector if placement else None) or {}
    tolerations = (placement.tolerations if placement else None) or ()
    gpu_selector = placement.gpu_selector if placement else None
    if any(labels.get(k) != v for k, v in selector.items()):
        return False
    for taint in taints:
        blocking = taint.effect in ("NoSchedule", "NoExecute")
        if blocking and not any(_tolerates(t, taint) for t in tolerations):
            return False
    if gpu_selector and gpu_selector.product and gpu.product != gpu_selector.product:
        return False
    minimum = gpu_selector.min_hbm_bytes if gpu_selector else None
    return minimum is None or (gpu.hbm_total_bytes or 0) >= minimum.bytes


# --- properties ---------------------------------------------------------------------------


@CASES
@given(worlds())
def test_every_deployment_is_placed_or_unplaced_exactly_once(world: Any) -> None:
    nodes, models, where = world
    result = run(nodes, models, where)
    uids = {m.metadata["uid"] for m in models}
    assert set(result.placed) | set(result.unplaced) == uids
    assert not set(result.placed) & set(result.unplaced)
    for uid, p in result.placed.items():
        assert p.uid == uid
        assert (p.reason == PlacedReason.PLACED) == (uid not in where)
        assert (p.moved_from is None) == (p.reason in (PlacedReason.KEPT, PlacedReason.PLACED))
        if p.reason == PlacedReason.KEPT:
            assert where[uid] == p.assignment


@CASES
@given(worlds())
def test_no_gpu_is_over_committed_and_no_model_breaks_its_selectors(world: Any) -> None:
    nodes, models, where = world
    result = run(nodes, models, where)
    gpus = _gpus_by_place(nodes)
    by_uid = {m.metadata["uid"]: m for m in models}
    loads: dict[tuple[str, str], Load] = defaultdict(Load)
    for uid, p in result.placed.items():
        assert (p.node, p.gpu) in gpus, "placed on a GPU of no live node"
        node, gpu = gpus[(p.node, p.gpu)]
        model = by_uid[uid]
        assert _allowed(model, node, gpu)
        weights = model.spec.model.weights_bytes.bytes
        kv = model.spec.model.kv_cache_bytes.bytes if model.spec.model.kv_cache_bytes else 0
        load = loads[(p.node, p.gpu)]
        if p.policy.pinned:
            load.pinned += weights + kv
        else:
            load.largest_unpinned = max(load.largest_unpinned, weights + kv)
        load.models += 1
        tier = p.policy.kv_host_bytes if kv else 0  # no KV cache, no host KV tier
        load.host += weights + (kv if p.policy.kv == "preserve" else 0) + tier
    for place, load in loads.items():
        _, gpu = gpus[place]
        budget = (gpu.hbm_total_bytes or 0) - (gpu.hbm_reserved_bytes or 0)
        overheads = (gpu.per_process_overhead_bytes or 0) * load.models
        assert load.pinned + load.largest_unpinned + overheads <= budget, place
        assert load.host <= (gpu.host_store_capacity_bytes or 0), place


@CASES
@given(worlds(), st.randoms(use_true_random=False))
def test_the_plan_does_not_depend_on_input_order(world: Any, rng: random.Random) -> None:
    nodes, models, where = world
    shuffled_nodes = [_shuffle_gpus(n, rng) for n in rng.sample(nodes, len(nodes))]
    shuffled_where = dict(rng.sample(list(where.items()), len(where)))
    expected = run(nodes, models, where)
    assert run(shuffled_nodes, rng.sample(models, len(models)), shuffled_where) == expected


def _shuffle_gpus(node: SwapNode, rng: random.Random) -> SwapNode:
    data = node.to_dict()
    rng.shuffle(data["status"]["gpus"])
    return SwapNode.from_dict(data)


@CASES
@given(worlds())
def test_replanning_with_its_own_assignments_keeps_every_placed_model(world: Any) -> None:
    nodes, models, where = world
    first = run(nodes, models, where)
    again = run(nodes, models, first.assignments())
    assert again.assignments() == first.assignments()
    assert all(p.reason == PlacedReason.KEPT for p in again.placed.values())
    assert {u: p.reason for u, p in again.unplaced.items()} == {
        u: p.reason for u, p in first.unplaced.items()
    }

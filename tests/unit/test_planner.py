"""The placement planner, rule by rule: where models go, why they move, why they cannot go."""

from __future__ import annotations

from typing import Any

import pytest

from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeployment, SwapNode
from modelswap_operator.planner import (
    Assignment,
    Placed,
    PlacedReason,
    Plan,
    Unplaced,
    UnplacedReason,
    plan,
)

pytestmark = pytest.mark.timeout(60)

GIB = 1 << 30
MIB = 1 << 20
OVERHEAD = 512 * MIB


def gpu(
    uuid: str,
    *,
    hbm_gib: int = 80,
    reserved_gib: int = 0,
    store_gib: int = 200,
    product: str = "H100",
    overhead: int = OVERHEAD,
) -> dict[str, Any]:
    return {
        "uuid": uuid,
        "ordinal": 0,
        "product": product,
        "hbmTotalBytes": hbm_gib * GIB,
        "hbmReservedBytes": reserved_gib * GIB,
        "perProcessOverheadBytes": overhead,
        "hostStoreCapacityBytes": store_gib * GIB,
    }


def node(
    name: str,
    *gpus: dict[str, Any],
    labels: dict[str, str] | None = None,
    taints: list[dict[str, str]] | None = None,
) -> SwapNode:
    status = {"gpus": list(gpus), "nodeLabels": labels or {}, "nodeTaints": taints or []}
    return SwapNode.from_dict({"metadata": {"name": name}, "status": status})


def model(
    uid: str,
    weights: str = "10Gi",
    *,
    kv: str | None = None,
    priority: int | None = None,
    pinned: bool | None = None,
    placement: dict[str, Any] | None = None,
    swap_policy: dict[str, Any] | None = None,
    kv_cache: dict[str, Any] | None = None,
) -> ModelDeployment:
    spec: dict[str, Any] = {"model": {"source": {"uri": f"/models/{uid}"}, "weightsBytes": weights}}
    if kv:
        spec["model"]["kvCacheBytes"] = kv
    policy = dict(swap_policy or {})
    if priority is not None:
        policy["priority"] = priority
    if pinned is not None:
        policy["pinned"] = pinned
    if policy:
        spec["swapPolicy"] = policy
    if placement:
        spec["placement"] = placement
    if kv_cache:
        spec["kvCache"] = kv_cache
    metadata = {
        "uid": uid,
        "name": uid,
        "namespace": "ns",
        "creationTimestamp": "2026-01-01T00:00:00Z",
    }
    return ModelDeployment.from_dict({"metadata": metadata, "spec": spec})


def run(
    nodes: list[SwapNode],
    models: list[ModelDeployment],
    assignments: dict[str, Assignment] | None = None,
) -> Plan:
    return plan(nodes, models, assignments or {}, BUILTIN_DEFAULTS)


def placed(result: Plan, uid: str) -> Placed:
    assert uid in result.placed, result.unplaced.get(uid)
    return result.placed[uid]


def unplaced(result: Plan, uid: str) -> Unplaced:
    assert uid in result.unplaced, result.placed.get(uid)
    return result.unplaced[uid]


# --- placing and keeping ------------------------------------------------------------------


def test_a_new_model_is_placed_with_its_effective_policy() -> None:
    result = run([node("n1", gpu("g1"))], [model("a", priority=7)])
    a = placed(result, "a")
    assert (a.node, a.gpu, a.reason, a.moved_from) == ("n1", "g1", PlacedReason.PLACED, None)
    assert a.policy.priority == 7 and a.policy.idle_after.raw == "10m"  # default merged in
    assert "n1/g1" in a.message and "GiB" in a.message
    assert result.assignments() == {"a": Assignment("n1", "g1")}


def test_an_assignment_that_still_fits_is_kept() -> None:
    nodes = [node("n1", gpu("g1"), gpu("g2"))]
    result = run(nodes, [model("a")], {"a": Assignment("n1", "g2")})
    a = placed(result, "a")
    assert (a.gpu, a.reason, a.moved_from) == ("g2", PlacedReason.KEPT, None)


def test_best_fit_prefers_the_gpu_already_in_use() -> None:
    nodes = [node("n1", gpu("g1"), gpu("g2"))]
    result = run(nodes, [model("a"), model("b")], {"a": Assignment("n1", "g2")})
    assert placed(result, "b").gpu == "g2"


def test_unpinned_models_share_one_slot_pinned_ones_each_need_their_own() -> None:
    # budget 40 GiB: two unpinned 30 GiB models take 30 GiB + 2 overheads
    nodes = [node("n1", gpu("g1", hbm_gib=40))]
    shared = run(nodes, [model("a", "30Gi"), model("b", "30Gi")])
    assert set(shared.placed) == {"a", "b"}
    pinned = run(nodes, [model("a", "30Gi", pinned=True), model("b", "30Gi", pinned=True)])
    assert set(pinned.placed) == {"a"}  # same priority and size: the UID decides
    assert unplaced(pinned, "b").reason == UnplacedReason.INSUFFICIENT_CAPACITY


def test_per_process_overhead_counts_once_per_model() -> None:
    # budget 10 GiB with 3 GiB overhead per process: three 1 GiB unpinned models need 10 GiB
    nodes = [node("n1", gpu("g1", hbm_gib=10, overhead=3 * GIB))]
    three = run(nodes, [model(uid, "1Gi") for uid in "abc"])
    assert len(three.placed) == 3
    four = run(nodes, [model(uid, "1Gi") for uid in "abcd"])
    assert len(four.placed) == 3 and set(four.unplaced) == {"d"}


def test_hbm_counts_weights_and_kv_cache_against_total_minus_reserved() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=40, reserved_gib=10))]  # budget 30 GiB
    assert "a" in run(nodes, [model("a", "20Gi", kv="9Gi")]).placed  # 29 GiB + 0.5 GiB
    too_big = unplaced(run(nodes, [model("a", "20Gi", kv="10Gi")]), "a")
    assert too_big.reason == UnplacedReason.EXCEEDS_GPU_BUDGET
    assert too_big.field == "spec.model.kvCacheBytes"  # the weights alone would fit


def test_host_store_holds_weights_preserved_kv_and_the_host_kv_tier() -> None:
    # 21 GiB store: 10 GiB weights + 1 GiB default KV tier each, so two models do not fit
    nodes = [node("n1", gpu("g1", store_gib=21))]
    result = run(nodes, [model("a", kv="1Mi"), model("b", kv="1Mi")])
    assert set(result.placed) == {"a"}
    assert unplaced(result, "b").reason == UnplacedReason.INSUFFICIENT_CAPACITY
    # a model without a KV cache has no host KV tier: two fit in 20 GiB
    no_kv = run([node("n1", gpu("g1", store_gib=20))], [model("a"), model("b")])
    assert set(no_kv.placed) == {"a", "b"}
    # kv: preserve adds the KV cache to host bytes
    preserve = {"kv": "preserve"}
    one = [node("n1", gpu("g1", store_gib=14))]
    assert "a" in run(one, [model("a", kv="3Gi", swap_policy=preserve)]).placed
    kv_tips = unplaced(run(one, [model("a", kv="4Gi", swap_policy=preserve)]), "a")
    assert (kv_tips.reason, kv_tips.field) == (
        UnplacedReason.EXCEEDS_HOST_STORE,
        "spec.swapPolicy.kv",
    )


def test_a_dropped_model_still_counts_its_weights_in_the_host_store() -> None:
    nodes = [node("n1", gpu("g1", store_gib=9))]
    result = run(nodes, [model("a", swap_policy={"onSwapOut": "drop"})])
    assert unplaced(result, "a").field == "spec.model.weightsBytes"


def test_placement_order_pinned_then_priority_then_size() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=40, store_gib=1000))]
    models = [
        model("low-big", "30Gi", pinned=True, priority=1),
        model("high-small", "20Gi", pinned=True, priority=9),
        model("unpinned", "5Gi", priority=1000),
    ]
    result = run(nodes, models)
    assert set(result.placed) == {"high-small", "unpinned"}
    assert set(result.unplaced) == {"low-big"}


# --- selectors and taints -----------------------------------------------------------------


def test_node_selector_must_be_a_subset_of_the_node_labels() -> None:
    nodes = [
        node("n1", gpu("g1"), labels={"pool": "a"}),
        node("n2", gpu("g2"), labels={"pool": "b", "zone": "z"}),
    ]
    result = run(nodes, [model("m", placement={"nodeSelector": {"pool": "b", "zone": "z"}})])
    assert placed(result, "m").node == "n2"


def test_untolerated_no_schedule_and_no_execute_taints_keep_models_off() -> None:
    taint = {"key": "dedicated", "value": "gh200", "effect": "NoSchedule"}
    nodes = [node("n1", gpu("g1"), taints=[taint]), node("n2", gpu("g2"))]
    assert placed(run(nodes, [model("m")]), "m").node == "n2"
    prefer = [{"key": "x", "effect": "PreferNoSchedule"}]
    assert placed(run([node("n1", gpu("g1"), taints=prefer)], [model("m")]), "m").node == "n1"


@pytest.mark.parametrize(
    ("toleration", "tolerated"),
    [
        ({"key": "dedicated", "operator": "Equal", "value": "gh200"}, True),
        ({"key": "dedicated", "value": "gh200"}, True),  # Equal is the default operator
        ({"key": "dedicated", "operator": "Equal", "value": "other"}, False),
        ({"key": "dedicated", "operator": "Exists"}, True),
        ({"operator": "Exists"}, True),  # empty key with Exists tolerates everything
        ({"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}, True),
        ({"key": "dedicated", "operator": "Exists", "effect": "NoExecute"}, False),
        ({"key": "other", "operator": "Exists"}, False),
    ],
)
def test_toleration_semantics_follow_kubernetes(
    toleration: dict[str, str], tolerated: bool
) -> None:
    taint = {"key": "dedicated", "value": "gh200", "effect": "NoSchedule"}
    nodes = [node("n1", gpu("g1"), taints=[taint])]
    result = run(nodes, [model("m", placement={"tolerations": [toleration]})])
    assert ("m" in result.placed) is tolerated


def test_gpu_selector_product_and_minimum_hbm() -> None:
    nodes = [
        node("n1", gpu("a100", product="A100", hbm_gib=80)),
        node(
            "n2", gpu("h100", product="H100", hbm_gib=80), gpu("h200", product="H200", hbm_gib=141)
        ),
    ]
    by_product = run(nodes, [model("m", placement={"gpuSelector": {"product": "H100"}})])
    assert placed(by_product, "m").gpu == "h100"
    by_size = run(nodes, [model("m", placement={"gpuSelector": {"minHbmBytes": "100Gi"}})])
    assert placed(by_size, "m").gpu == "h200"


# --- moves --------------------------------------------------------------------------------


def test_a_model_on_a_lost_node_moves_with_reason_node_lost() -> None:
    result = run([node("n2", gpu("g2"))], [model("a")], {"a": Assignment("n1", "g1")})
    a = placed(result, "a")
    assert (a.node, a.reason, a.moved_from) == (
        "n2",
        PlacedReason.NODE_LOST,
        Assignment("n1", "g1"),
    )
    assert "n1" in a.message


def test_a_model_on_a_gpu_its_node_no_longer_reports_moves_with_reason_gpu_lost() -> None:
    result = run([node("n1", gpu("g2"))], [model("a")], {"a": Assignment("n1", "g1")})
    assert placed(result, "a").reason == PlacedReason.GPU_LOST


def test_a_node_selector_that_no_longer_matches_moves_the_model() -> None:
    nodes = [
        node("n1", gpu("g1"), labels={"pool": "a"}),
        node("n2", gpu("g2"), labels={"pool": "b"}),
    ]
    m = model("m", placement={"nodeSelector": {"pool": "b"}})
    result = run(nodes, [m], {"m": Assignment("n1", "g1")})
    moved = placed(result, "m")
    assert (moved.node, moved.reason) == ("n2", PlacedReason.SELECTOR_CHANGED)
    assert "nodeSelector" in moved.message


def test_a_gpu_selector_that_no_longer_matches_moves_the_model() -> None:
    nodes = [node("n1", gpu("g1", product="A100"), gpu("g2", product="H100"))]
    m = model("m", placement={"gpuSelector": {"product": "H100"}})
    result = run(nodes, [m], {"m": Assignment("n1", "g1")})
    assert (placed(result, "m").gpu, placed(result, "m").reason) == (
        "g2",
        PlacedReason.SELECTOR_CHANGED,
    )


def test_a_new_untolerated_taint_moves_the_model() -> None:
    taint = {"key": "maintenance", "effect": "NoExecute"}
    nodes = [node("n1", gpu("g1"), taints=[taint]), node("n2", gpu("g2"))]
    result = run(nodes, [model("m")], {"m": Assignment("n1", "g1")})
    moved = placed(result, "m")
    assert (moved.node, moved.reason) == ("n2", PlacedReason.TAINT_NOT_TOLERATED)
    assert "maintenance:NoExecute" in moved.message


def test_when_a_gpu_no_longer_fits_its_models_the_lowest_priority_moves() -> None:
    # g1's budget shrank to 30 GiB: two pinned 20 GiB models no longer fit together
    nodes = [node("n1", gpu("g1", hbm_gib=40, reserved_gib=10), gpu("g2"))]
    models = [
        model("hi", "20Gi", pinned=True, priority=10),
        model("lo", "20Gi", pinned=True, priority=1),
    ]
    where = {"hi": Assignment("n1", "g1"), "lo": Assignment("n1", "g1")}
    result = run(nodes, models, where)
    assert placed(result, "hi").reason == PlacedReason.KEPT
    lo = placed(result, "lo")
    assert (lo.gpu, lo.reason, lo.moved_from) == (
        "g2",
        PlacedReason.NO_LONGER_FITS,
        Assignment("n1", "g1"),
    )


def test_a_model_that_must_move_and_finds_no_room_says_where_it_was() -> None:
    nodes = [node("n2", gpu("g2", hbm_gib=20))]
    result = run(
        nodes,
        [model("big", "15Gi", pinned=True), model("a", "10Gi", pinned=True)],
        {"a": Assignment("n1", "g1"), "big": Assignment("n2", "g2")},
    )
    a = unplaced(result, "a")
    assert a.reason == UnplacedReason.INSUFFICIENT_CAPACITY
    assert "n1/g1" in a.message and "gone" in a.message


def test_kept_models_are_accounted_before_new_ones_even_of_higher_priority() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=30))]
    models = [
        model("old", "20Gi", pinned=True, priority=1),
        model("new", "20Gi", pinned=True, priority=9),
    ]
    result = run(nodes, models, {"old": Assignment("n1", "g1")})
    assert placed(result, "old").reason == PlacedReason.KEPT
    assert unplaced(result, "new").reason == UnplacedReason.INSUFFICIENT_CAPACITY


def test_replanning_with_its_own_assignments_keeps_everything() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=40), gpu("g2", hbm_gib=40)), node("n2", gpu("g3"))]
    models = [model(f"m{i}", f"{5 + i}Gi", pinned=i % 3 == 0, priority=i % 4) for i in range(12)]
    first = run(nodes, models)
    again = run(nodes, models, first.assignments())
    assert again.assignments() == first.assignments()
    assert {p.reason for p in again.placed.values()} == {PlacedReason.KEPT}
    assert set(again.unplaced) == set(first.unplaced)


# --- why a model cannot be placed ---------------------------------------------------------


def test_invalid_policy_names_the_field() -> None:
    m = model("m", swap_policy={"minResident": "20m"})  # over the default idleAfter 10m
    result = unplaced(run([node("n1", gpu("g1"))], [m]), "m")
    assert (result.reason, result.field, result.policy) == (
        UnplacedReason.POLICY_INVALID,
        "spec.swapPolicy.minResident",
        None,
    )
    assert "idleAfter" in result.message


def test_no_live_node_with_gpus() -> None:
    result = unplaced(run([node("n1")], [model("m")]), "m")
    assert (result.reason, result.field) == (UnplacedReason.NO_SWAP_NODES, None)


def test_no_node_matches_the_node_selector() -> None:
    m = model("m", placement={"nodeSelector": {"pool": "x"}})
    result = unplaced(run([node("n1", gpu("g1"), labels={"pool": "a"})], [m]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.NO_MATCHING_NODE,
        "spec.placement.nodeSelector",
    )
    assert "pool=x" in result.message


def test_every_matching_node_has_an_untolerated_taint() -> None:
    nodes = [node("n1", gpu("g1"), taints=[{"key": "gpu", "value": "big", "effect": "NoSchedule"}])]
    result = unplaced(run(nodes, [model("m")]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.TAINTS_NOT_TOLERATED,
        "spec.placement.tolerations",
    )
    assert "n1: gpu=big:NoSchedule" in result.message


def test_no_gpu_of_the_product() -> None:
    m = model("m", placement={"gpuSelector": {"product": "B200"}})
    result = unplaced(run([node("n1", gpu("g1", product="H100"))], [m]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.NO_MATCHING_GPU,
        "spec.placement.gpuSelector.product",
    )
    assert "H100" in result.message


def test_no_gpu_with_the_minimum_hbm() -> None:
    m = model("m", placement={"gpuSelector": {"minHbmBytes": "100Gi"}})
    result = unplaced(run([node("n1", gpu("g1", hbm_gib=80))], [m]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.NO_MATCHING_GPU,
        "spec.placement.gpuSelector.minHbmBytes",
    )
    assert "100 GiB" in result.message and "80 GiB" in result.message


def test_larger_than_every_gpu_budget() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=80, reserved_gib=2))]
    result = unplaced(run(nodes, [model("m", "78Gi")]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.EXCEEDS_GPU_BUDGET,
        "spec.model.weightsBytes",
    )
    assert "78 GiB" in result.message and "512 MiB" in result.message and "n1/g1" in result.message


@pytest.mark.parametrize(
    ("weights", "kv_cache", "field"),
    [
        ("30Gi", None, "spec.model.weightsBytes"),
        ("10Gi", {"hostBytes": "20Gi"}, "spec.kvCache.hostBytes"),
    ],
)
def test_larger_than_every_host_store(
    weights: str, kv_cache: dict[str, str] | None, field: str
) -> None:
    nodes = [node("n1", gpu("g1", store_gib=20))]
    kv = "1Gi" if kv_cache else None  # the host KV tier exists only with a KV cache
    result = unplaced(run(nodes, [model("m", weights, kv=kv, kv_cache=kv_cache)]), "m")
    assert (result.reason, result.field) == (UnplacedReason.EXCEEDS_HOST_STORE, field)
    assert "20 GiB" in result.message


def test_the_host_store_is_checked_on_gpus_whose_hbm_fits() -> None:
    # g1 has the HBM, g2 the host store: no single GPU holds the model
    nodes = [node("n1", gpu("g1", hbm_gib=80, store_gib=5), gpu("g2", hbm_gib=20, store_gib=500))]
    result = unplaced(run(nodes, [model("m", "40Gi")]), "m")
    assert (result.reason, result.field) == (
        UnplacedReason.EXCEEDS_HOST_STORE,
        "spec.model.weightsBytes",
    )


def test_insufficient_capacity_says_how_much_is_free_where() -> None:
    nodes = [node("n1", gpu("g1", hbm_gib=40))]
    models = [model("a", "30Gi", pinned=True), model("b", "30Gi", pinned=True)]
    result = unplaced(run(nodes, models, {"a": Assignment("n1", "g1")}), "b")
    assert (result.reason, result.field) == (
        UnplacedReason.INSUFFICIENT_CAPACITY,
        "spec.model.weightsBytes",
    )
    assert result.policy is not None and result.policy.pinned
    assert "9.5 GiB on n1/g1" in result.message  # 40 - 30 - 0.5 overhead


# --- input handling -----------------------------------------------------------------------


def test_the_plan_does_not_depend_on_input_order() -> None:
    nodes = [node("n1", gpu("g1"), gpu("g2")), node("n2", gpu("g3"))]
    models = [model(f"m{i}", f"{10 + 5 * i}Gi", priority=i % 3) for i in range(8)]
    assert run(nodes, models) == run(nodes[::-1], models[::-1])


def test_duplicate_uids_are_refused() -> None:
    with pytest.raises(ValueError, match="UIDs"):
        run([node("n1", gpu("g1"))], [model("a"), model("a")])


def test_assignments_of_unknown_models_are_ignored() -> None:
    result = run([node("n1", gpu("g1"))], [model("a")], {"gone": Assignment("n1", "g1")})
    assert set(result.placed) == {"a"} and not result.unplaced

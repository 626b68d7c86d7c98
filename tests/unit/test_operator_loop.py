"""The planner loop over in-memory stand-ins for the API server and the agents: a burst of
arriving ModelDeployments costs a few plans, not one per object; every node gets its full
set; status is written once per object per change, never when nothing changed."""

from __future__ import annotations

import asyncio
import base64
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from modelswap_api.control import DesiredSet, DesiredSetResult, EntryResult, NodeInfo
from modelswap_operator.cache import Cache
from modelswap_operator.errors import AgentRefused
from modelswap_operator.events import EventRecorder
from modelswap_operator.metrics import OperatorMetrics
from modelswap_operator.reconciler import Reconciler
from modelswap_operator.settings import TOKEN_KEY, OperatorSettings
from modelswap_operator.tokens import TokenSource
from tests.support.waiting import until_on_loop

pytestmark = pytest.mark.asyncio
GIB = 1 << 30
NODES, GPUS_PER_NODE, MODELS = 20, 4, 2000


def swapnode(name: str) -> dict[str, Any]:
    gpus = [
        {"uuid": f"{name}-gpu-{i}", "ordinal": i, "hbmTotalBytes": 80 * GIB,
         "hostStoreCapacityBytes": 400 * GIB}
        for i in range(GPUS_PER_NODE)
    ]  # fmt: skip
    return {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "SwapNode",
        # labelled as the operator keeps a live node's SwapNode: a turn writes nothing to it
        "metadata": {"name": name, "resourceVersion": "1",
                     "labels": {"modelswap.io/lease": "Live"}},
        "status": {"endpoint": f"https://{name}:9443", "certificate": "unused by the fakes",
                   "gatewayEndpoint": f"http://10.0.0.{len(name)}:8080", "gpus": gpus,
                   "nodeLabels": {}},
    }  # fmt: skip


def deployment(index: int) -> dict[str, Any]:
    return {
        "apiVersion": "modelswap.io/v1alpha1",
        "kind": "ModelDeployment",
        "metadata": {"name": f"m{index}", "namespace": "default", "generation": 1,
                     "uid": f"00000000-0000-4000-8000-{index:012d}", "resourceVersion": "1"},
        "spec": {"model": {"source": {"uri": "/models/mlp"},
                           "weightsBytes": f"{1 + index % 7}Gi"},
                 "swapPolicy": {"priority": index % 20 * 50}},
    }  # fmt: skip


class FakeKube:
    """`KubeIO.call` answered from memory, by helper name; writes are recorded."""

    def __init__(self) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        self.swapnodes = [swapnode(f"node-{i:02d}") for i in range(NODES)]
        self.leases = [{"metadata": {"name": s["metadata"]["name"]},
                        "spec": {"renewTime": now}} for s in self.swapnodes]  # fmt: skip
        self.status_writes: Counter[str] = Counter()
        self.statuses: dict[str, dict[str, Any]] = {}
        self.swapnode_writes: list[tuple[str, str]] = []
        self.token = {"data": {TOKEN_KEY: base64.b64encode(b"t").decode()}}

    async def call(self, helper: Callable[..., Any], *args: Any, **_: Any) -> Any:
        name = helper.__name__
        if name == "list_model_deployments":
            return []
        if name == "list_swapnodes":
            return self.swapnodes
        if name == "list_leases":
            return self.leases
        if name == "read_secret":
            return self.token
        if name in ("read_service", "read_endpoint_slice"):
            return None
        if name in ("create_service", "create_endpoint_slice", "create_event"):
            return args[-1]
        if name == "patch_model_deployment_status":
            _namespace, object_name, patch = args
            self.status_writes[object_name] += 1
            self.statuses[object_name] = patch["status"]
            return {}
        if name in ("patch_swapnode", "delete_swapnode"):  # a lost node's label, its removal
            self.swapnode_writes.append((name, args[0]))
            return {}
        raise AssertionError(f"unexpected call {name}")


class FakeAgent:
    """Answers pushes; refuses the whole set (400 naming the entry) while it holds `refuse`."""

    def __init__(self, refuse: str | None = None) -> None:
        self.sets: list[DesiredSet] = []
        self.refuse = refuse

    async def node(self) -> NodeInfo:
        return NodeInfo(node_name="fake", agent_version="0")

    async def put_desired(self, desired: DesiredSet) -> DesiredSetResult:
        for index, entry in enumerate(desired.entries):
            if entry.name == self.refuse:
                raise AgentRefused("400 Invalid", status=400, reason="Invalid",
                                   field=f"entries[{index}].spec.model.weightsBytes")  # fmt: skip
        self.sets.append(desired)
        results = tuple(EntryResult(uid=e.uid, outcome="applied", reason="Loading")
                        for e in desired.entries)  # fmt: skip
        return DesiredSetResult(revision=desired.revision, results=results)


class FakeAgents:
    def __init__(self, refuse: str | None = None) -> None:
        self.agents: dict[str, FakeAgent] = {}
        self.refuse = refuse

    async def for_node(self, address: Any, token: str) -> FakeAgent:
        assert token == "t"
        return self.agents.setdefault(address.node, FakeAgent(self.refuse))


def reconciler_over(kube: FakeKube, agents: FakeAgents, cache: Cache) -> Reconciler:
    settings = OperatorSettings(batch_seconds=0.2, tick_seconds=1.0, grace_seconds=90)
    return Reconciler(
        settings, cache, io=kube, agents=agents, events=EventRecorder(kube),  # type: ignore[arg-type]
        metrics=OperatorMetrics(CollectorRegistry()), term=lambda: 1,
        tokens=TokenSource(kube, "ops", "token"),  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.timeout(120)
async def test_a_burst_of_models_costs_a_few_plans_and_each_node_gets_its_full_set() -> None:
    kube, agents, cache = FakeKube(), FakeAgents(), Cache()
    reconciler = reconciler_over(kube, agents, cache)
    metrics = reconciler.metrics
    loop = asyncio.create_task(reconciler.run())
    try:
        await until_on_loop(lambda: reconciler.ready, "the loop's caches")
        for index in range(MODELS):  # arriving as watch events do, a few per loop pass
            cache.put_deployment(deployment(index))
            if index % 20 == 0:
                await asyncio.sleep(0)

        def placed() -> bool:
            return len(kube.statuses) == MODELS and all(
                s.get("node") for s in kube.statuses.values()
            )

        await until_on_loop(placed, "every model placed")
        plans = metrics.registry.get_sample_value("modelswap_operator_plan_duration_seconds_count")
        assert plans is not None and plans <= 10, plans

        # Each node's last set is exactly the models placed there, with their GPUs.
        by_node: dict[str, set[tuple[str, str]]] = {}
        for name, status in kube.statuses.items():
            uid = deployment(int(name[1:]))["metadata"]["uid"]
            by_node.setdefault(status["node"], set()).add((uid, status["gpu"]))
        for node, agent in agents.agents.items():
            last = agent.sets[-1]
            assert {(e.uid, e.gpu) for e in last.entries} == by_node.get(node, set())
            assert [s.revision.term for s in agent.sets] == [1] * len(agent.sets)
        assert sum(len(a.sets[-1].entries) for a in agents.agents.values()) == MODELS

        # Nothing changed: more turns, no status write.
        writes = sum(kube.status_writes.values())
        turns = metrics.registry.get_sample_value("modelswap_operator_reconcile_turns_total") or 0
        await until_on_loop(
            lambda: (metrics.registry.get_sample_value("modelswap_operator_reconcile_turns_total")
                     or 0) >= turns + 2,
            "two more turns",
        )  # fmt: skip
        assert sum(kube.status_writes.values()) == writes
        assert max(kube.status_writes.values()) <= plans + 1
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


@pytest.mark.timeout(60)
async def test_refused_and_unreadable_models_are_reported_on_their_objects_only() -> None:
    kube, agents, cache = FakeKube(), FakeAgents(refuse="m1"), Cache()
    kube.swapnodes, kube.leases = kube.swapnodes[:1], kube.leases[:1]
    reconciler = reconciler_over(kube, agents, cache)
    loop = asyncio.create_task(reconciler.run())
    try:
        for index in range(3):
            cache.put_deployment(deployment(index))
        unreadable = deployment(3)
        unreadable["spec"]["model"]["weightsBytes"] = "lots"  # stored under another schema
        cache.put_deployment(unreadable)

        def loaded_reason(name: str) -> str | None:
            for condition in (kube.statuses.get(name) or {}).get("conditions") or ():
                if condition["type"] == "Loaded":
                    return str(condition["reason"])
            return None

        await until_on_loop(lambda: loaded_reason("m1") == "RefusedByAgent", "m1 refused")
        condition = next(c for c in kube.statuses["m1"]["conditions"] if c["type"] == "Loaded")
        assert condition["message"].startswith("spec.model.weightsBytes")
        pushed = {e.name for e in agents.agents["node-00"].sets[-1].entries}
        assert pushed == {"m0", "m2"}  # the others are still sent
        placed = next(c for c in kube.statuses["m3"]["conditions"] if c["type"] == "Placed")
        assert placed["reason"] == "InvalidSpec" and "weightsBytes" in placed["message"]
    finally:
        loop.cancel()
        with pytest.raises(asyncio.CancelledError):
            await loop


async def test_a_route_ensured_from_the_same_inputs_is_not_ensured_again() -> None:
    kube, agents, cache = FakeKube(), FakeAgents(), Cache()
    kube.swapnodes, kube.leases = kube.swapnodes[:2], kube.leases[:2]
    reconciler = reconciler_over(kube, agents, cache)
    cache.complete_deployments([deployment(i) for i in range(6)])
    cache.complete_swapnodes(kube.swapnodes)
    ensured: list[tuple[str, str, bool]] = []
    ensure = reconciler.router.ensure

    async def counting_ensure(namespace: str, owner: Any, gateway: Any, node: str,
                              ready: bool, *, new: bool = False) -> None:  # fmt: skip
        ensured.append((owner["name"], node, ready))
        await ensure(namespace, owner, gateway, node, ready, new=new)

    reconciler.router.ensure = counting_ensure  # type: ignore[method-assign]
    await reconciler.turn()
    assert sorted(name for name, _, _ in ensured) == [f"m{i}" for i in range(6)]
    assert all(status.get("endpoint") for status in kube.statuses.values())

    ensured.clear()
    await reconciler.turn()
    assert ensured == []  # nothing changed: not one route ensured, every status as before
    assert all(status.get("endpoint") for status in kube.statuses.values())

    reconciler.router.forget()  # as after a failed write: every route is ensured again
    await reconciler.turn()
    assert sorted(name for name, _, _ in ensured) == [f"m{i}" for i in range(6)]

    ensured.clear()  # the Lease of the node holding them runs out: every route changes
    held = {status["node"] for status in kube.statuses.values()}
    assert held == {"node-00"}
    kube.leases[0] = {"metadata": {"name": "node-00"},
                      "spec": {"renewTime": "2000-01-01T00:00:00.000000Z"}}  # fmt: skip
    await reconciler.turn()
    assert sorted(name for name, _, _ in ensured) == [f"m{i}" for i in range(6)]
    assert ("node-00", True) not in {(node, ready) for _, node, ready in ensured}


async def test_a_turn_whose_inputs_did_not_change_makes_no_plan() -> None:
    kube, agents, cache = FakeKube(), FakeAgents(), Cache()
    kube.swapnodes, kube.leases = kube.swapnodes[:2], kube.leases[:2]
    reconciler = reconciler_over(kube, agents, cache)
    cache.complete_deployments([deployment(i) for i in range(6)])
    cache.complete_swapnodes(kube.swapnodes)

    def plans() -> float:
        name = "modelswap_operator_plan_duration_seconds_count"
        return reconciler.metrics.registry.get_sample_value(name) or 0

    await reconciler.turn()
    await reconciler.turn()  # the first plan's placements are this one's assignments
    made = plans()
    assert made == 2
    await reconciler.turn()
    assert plans() == made  # nothing changed
    heard = dict(kube.swapnodes[1], metadata={"name": "node-01", "resourceVersion": "2"})
    cache.complete_swapnodes([kube.swapnodes[0], heard])  # a new body, the same node
    await reconciler.turn()
    assert plans() == made
    cache.put_deployment(deployment(6))
    await reconciler.turn()
    assert plans() == made + 1
    assert kube.statuses["m6"].get("node")
    kube.leases[0] = {"metadata": {"name": "node-00"},
                      "spec": {"renewTime": "2000-01-01T00:00:00.000000Z"}}  # fmt: skip
    await reconciler.turn()
    assert plans() == made + 2
    assert {status["node"] for status in kube.statuses.values()} == {"node-01"}

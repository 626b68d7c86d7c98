"""The heartbeat's objects (pure) and its decisions against an in-memory cluster."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from modelswap_api.kube import Conflict, KubeError, NotFound
from modelswap_api.models import GpuStatus, HostedModel, Link, SwapNodeStatus
from modelswap_sidecar.heartbeat.heartbeat import Heartbeat
from modelswap_sidecar.heartbeat.objects import (
    NodeFacts,
    desired_status,
    micro_time,
    new_lease,
    owned_by,
    owner_patch,
    parse_micro_time,
    renewed_lease,
    swapnode_body,
)
from modelswap_sidecar.heartbeat.report import NodeReport
from modelswap_sidecar.heartbeat.settings import HeartbeatSettings
from tests.support.waiting import until_on_loop

NODE = {
    "apiVersion": "v1",
    "kind": "Node",
    "metadata": {"name": "gpu-1", "uid": "uid-1", "labels": {"pool": "h100", "zone": "a"}},
    "spec": {
        "taints": [
            {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
            {"key": "dedicated", "value": "ml", "effect": "NoExecute", "timeAdded": "x"},
        ]
    },
}
GPU = GpuStatus(
    uuid="sim-0",
    ordinal=0,
    product="sim",
    hbm_total_bytes=80 << 30,
    link=Link(kind="sim", host_to_device_gbps=17.0, device_to_host_gbps=17.0),
)
REPORT = NodeReport(agent_version="0.1.0", endpoint="http://10.0.0.1:9443", gpus=(GPU,))
T0 = datetime(2026, 1, 2, 3, 4, 5, 678901, tzinfo=UTC)


def test_node_facts_status_and_swapnode_body() -> None:
    facts = NodeFacts.from_node(NODE)
    status = desired_status(REPORT, facts)
    assert status["nodeLabels"] == {"pool": "h100", "zone": "a"}
    assert status["nodeTaints"] == [
        {"key": "nvidia.com/gpu", "effect": "NoSchedule"},
        {"key": "dedicated", "effect": "NoExecute", "value": "ml"},
    ]
    assert status["agentVersion"] == "0.1.0" and status["endpoint"] == "http://10.0.0.1:9443"
    assert status["gpus"][0]["link"] == {
        "kind": "sim",
        "hostToDeviceGBps": 17.0,
        "deviceToHostGBps": 17.0,
    }
    assert status["models"] == [] and "conditions" not in status
    assert SwapNodeStatus.from_dict(status).gpus == (GPU,)  # the typed model reads it back

    body = swapnode_body(facts)
    assert body["apiVersion"] == "modelswap.io/v1alpha1" and body["kind"] == "SwapNode"
    assert body["metadata"] == {
        "name": "gpu-1",
        "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": "gpu-1", "uid": "uid-1"}],
    }
    assert body["spec"] == {"nodeName": "gpu-1"} and "status" not in body
    assert owned_by(body, facts)
    recreated = NodeFacts.from_node({**NODE, "metadata": {**NODE["metadata"], "uid": "uid-2"}})  # type: ignore[dict-item]
    assert not owned_by(body, recreated)
    other_owner = {"apiVersion": "x/v1", "kind": "Thing", "name": "t", "uid": "u"}
    body["metadata"]["ownerReferences"].append(other_owner)
    patch = owner_patch(body, recreated)
    assert patch["metadata"]["ownerReferences"] == [other_owner, recreated.owner_reference()]


def test_lease_bodies_renewal_and_takeover() -> None:
    lease = new_lease(
        name="gpu-1", namespace="leases", holder="agent-a", duration_seconds=20, now=T0
    )
    assert lease["spec"] == {
        "holderIdentity": "agent-a",
        "leaseDurationSeconds": 20,
        "acquireTime": "2026-01-02T03:04:05.678901Z",
        "renewTime": "2026-01-02T03:04:05.678901Z",
        "leaseTransitions": 0,
    }
    lease["metadata"]["resourceVersion"] = "7"
    later = T0 + timedelta(seconds=5)
    renewed = renewed_lease(lease, holder="agent-a", duration_seconds=20, now=later)
    assert renewed["metadata"]["resourceVersion"] == "7"  # for the PUT's concurrency check
    assert renewed["spec"]["renewTime"] == micro_time(later)
    assert renewed["spec"]["acquireTime"] == lease["spec"]["acquireTime"]
    assert lease["spec"]["renewTime"] == micro_time(T0)  # the input is not modified
    taken = renewed_lease(renewed, holder="agent-b", duration_seconds=30, now=later)
    assert taken["spec"]["holderIdentity"] == "agent-b" and taken["spec"]["leaseTransitions"] == 1
    assert taken["spec"]["acquireTime"] == micro_time(later)
    assert parse_micro_time("2026-01-02T03:04:05.678901Z") == T0
    assert parse_micro_time("2026-01-02T03:04:05Z") == T0.replace(microsecond=0)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"node_name": ""},
        {"node_name": "n", "renew_interval_seconds": 30.0, "lease_duration_seconds": 20},
        {"node_name": "n", "status_interval_seconds": 0.0},
        {"node_name": "n", "lease_duration_seconds": 0},
    ],
)
def test_settings_refuse_nonsense(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HeartbeatSettings(**kwargs)


class FakeCluster:
    """Node, SwapNode and Lease in memory; counts calls; can be made to fail."""

    def __init__(self) -> None:
        self.node: dict[str, Any] = copy.deepcopy(NODE)
        self.swapnode: dict[str, Any] | None = None
        self.lease: dict[str, Any] | None = None
        self.calls: list[str] = []
        self.rv = 0
        self.down = False
        self.conflict_next_lease_write = False

    def _enter(self, call: str) -> None:
        self.calls.append(call)
        if self.down:
            raise KubeError(f"{call}: API server unreachable", status=None)

    def _stamp(self, obj: dict[str, Any]) -> dict[str, Any]:
        self.rv += 1
        obj.setdefault("metadata", {})["resourceVersion"] = str(self.rv)
        return copy.deepcopy(obj)

    def count(self, call: str) -> int:
        return self.calls.count(call)

    async def read_node(self, name: str) -> dict[str, Any]:
        self._enter("read_node")
        return copy.deepcopy(self.node)

    async def read_swapnode(self, name: str) -> dict[str, Any] | None:
        self._enter("read_swapnode")
        return copy.deepcopy(self.swapnode)

    async def create_swapnode(self, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("create_swapnode")
        if self.swapnode is not None:
            raise Conflict("exists", status=409)
        self.swapnode = dict(copy.deepcopy(body))
        return self._stamp(self.swapnode)

    async def patch_swapnode(self, name: str, patch: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("patch_swapnode")
        assert self.swapnode is not None
        self.swapnode["metadata"].update(copy.deepcopy(patch["metadata"]))
        return self._stamp(self.swapnode)

    async def replace_swapnode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("replace_swapnode_status")
        if self.swapnode is None:
            raise NotFound("gone", status=404)
        self.swapnode["status"] = copy.deepcopy(dict(status))
        return self._stamp(self.swapnode)

    async def read_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        self._enter("read_lease")
        return copy.deepcopy(self.lease)

    async def create_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("create_lease")
        if self.lease is not None:
            raise Conflict("exists", status=409)
        self.lease = dict(copy.deepcopy(body))
        return self._stamp(self.lease)

    async def replace_lease(self, namespace: str, body: Mapping[str, Any]) -> dict[str, Any]:
        self._enter("replace_lease")
        if self.lease is None:
            raise NotFound("gone", status=404)
        if self.conflict_next_lease_write or (
            body["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]
        ):
            self.conflict_next_lease_write = False
            self.lease = self._stamp(self.lease)  # someone else wrote it
            raise Conflict("stale resourceVersion", status=409)
        self.lease = dict(copy.deepcopy(body))
        return self._stamp(self.lease)


class Clock:
    def __init__(self) -> None:
        self.seconds = 100.0

    def __call__(self) -> float:
        return self.seconds


def make(
    cluster: FakeCluster, report: list[NodeReport], **settings: Any
) -> tuple[Heartbeat, Clock, list[int]]:
    clock = Clock()
    renewed: list[int] = []
    heartbeat = Heartbeat(
        HeartbeatSettings(node_name="gpu-1", lease_namespace="leases", **settings),
        cluster,
        lambda: report[-1],
        on_renewed=lambda: renewed.append(1),
        monotonic=clock,
        wall_clock=lambda: T0 + timedelta(seconds=clock.seconds),
    )
    return heartbeat, clock, renewed


@pytest.mark.asyncio
async def test_status_is_written_only_when_the_report_or_the_node_changes() -> None:
    cluster = FakeCluster()
    reports = [REPORT]
    heartbeat, clock, _ = make(cluster, reports, node_refresh_seconds=30.0)
    assert await heartbeat.write_status_once()
    assert cluster.count("create_swapnode") == 1 and heartbeat.status_writes == 1
    assert cluster.swapnode is not None
    assert cluster.swapnode["status"]["nodeLabels"] == {"pool": "h100", "zone": "a"}
    for _ in range(5):
        assert not await heartbeat.write_status_once()
    assert cluster.count("replace_swapnode_status") == 1 and cluster.count("read_node") == 1

    reports.append(
        REPORT.__class__(
            **{**REPORT.__dict__, "models": (HostedModel(uid="u1", state="Resident"),)}
        )
    )
    assert await heartbeat.write_status_once()
    assert cluster.swapnode["status"]["models"] == [{"uid": "u1", "state": "Resident"}]

    cluster.node["metadata"]["labels"]["pool"] = "gh200"
    assert not await heartbeat.write_status_once()  # the Node is re-read only after 30 s
    clock.seconds += 30
    assert await heartbeat.write_status_once()
    assert cluster.swapnode["status"]["nodeLabels"]["pool"] == "gh200"
    assert cluster.count("replace_swapnode_status") == 3 == heartbeat.status_writes


@pytest.mark.asyncio
async def test_a_restarted_agent_with_the_same_report_writes_nothing() -> None:
    cluster = FakeCluster()
    first, _, _ = make(cluster, [REPORT])
    assert await first.write_status_once()
    second, _, _ = make(cluster, [REPORT])
    assert not await second.write_status_once()
    assert cluster.count("create_swapnode") == 1 and cluster.count("replace_swapnode_status") == 1


@pytest.mark.asyncio
async def test_a_deleted_or_edited_swapnode_is_repaired_at_the_next_node_refresh() -> None:
    cluster = FakeCluster()
    heartbeat, clock, _ = make(cluster, [REPORT], node_refresh_seconds=10.0)
    await heartbeat.write_status_once()
    cluster.swapnode = None
    assert not await heartbeat.write_status_once()  # unnoticed until the refresh
    clock.seconds += 10
    assert await heartbeat.write_status_once()
    assert cluster.count("create_swapnode") == 2 and cluster.swapnode is not None
    assert cluster.swapnode["status"]["agentVersion"] == "0.1.0"

    cluster.swapnode["status"]["agentVersion"] = "edited"
    clock.seconds += 10
    assert await heartbeat.write_status_once()
    assert cluster.swapnode["status"]["agentVersion"] == "0.1.0"

    cluster.node["metadata"]["uid"] = "uid-2"  # the Node was deleted and created again
    clock.seconds += 10
    assert not await heartbeat.write_status_once()  # same status, but the owner is fixed
    assert cluster.swapnode["metadata"]["ownerReferences"][-1]["uid"] == "uid-2"
    assert cluster.count("patch_swapnode") == 1


@pytest.mark.asyncio
async def test_lease_is_created_renewed_and_survives_a_conflict() -> None:
    cluster = FakeCluster()
    heartbeat, clock, _ = make(cluster, [REPORT], holder_identity="pod-a")
    await heartbeat.renew_once()
    assert cluster.lease is not None and cluster.lease["spec"]["holderIdentity"] == "pod-a"
    assert cluster.lease["spec"]["leaseDurationSeconds"] == 20
    created = parse_micro_time(cluster.lease["spec"]["renewTime"])
    clock.seconds += 5
    await heartbeat.renew_once()
    assert parse_micro_time(cluster.lease["spec"]["renewTime"]) == created + timedelta(seconds=5)
    cluster.conflict_next_lease_write = True
    clock.seconds += 5
    await heartbeat.renew_once()  # re-read, retried once
    assert parse_micro_time(cluster.lease["spec"]["renewTime"]) == created + timedelta(seconds=10)
    assert cluster.count("create_lease") == 1 and cluster.count("read_lease") == 2


@pytest.mark.asyncio
async def test_renewal_failures_are_counted_and_reported_until_it_works_again() -> None:
    cluster = FakeCluster()
    heartbeat, _, renewed = make(cluster, [REPORT], renew_interval_seconds=0.01,
                                 lease_duration_seconds=1, status_interval_seconds=0.01)  # fmt: skip
    async with heartbeat:
        await until_on_loop(lambda: renewed, "a renewal", 5.0, poll_seconds=0.01)
        assert not heartbeat.renewals_failing and heartbeat.last_renewal_monotonic_seconds == 100.0
        cluster.down = True
        await until_on_loop(lambda: heartbeat.consecutive_renewal_failures >= 3,
                            "three failed renewals", 5.0, poll_seconds=0.01)  # fmt: skip
        assert heartbeat.renewals_failing and "unreachable" in (heartbeat.last_error or "")
        before = len(renewed)
        cluster.down = False
        await until_on_loop(lambda: not heartbeat.renewals_failing, "renewals working again", 5.0,
                            poll_seconds=0.01)  # fmt: skip
        assert len(renewed) > before
    assert not heartbeat.running

"""The heartbeat against the API emulator, through `modelswap_api.kube` and the official
client: the SwapNode appears (the Node's labels and taints, an ownerReference), its status
is written only on change, the Lease is renewed, and a stopped heartbeat lets it go stale."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pytest

from modelswap_api import kube
from modelswap_api.models import GpuStatus, HostedModel, Link
from modelswap_sidecar.heartbeat.cluster import KubeNodeCluster
from modelswap_sidecar.heartbeat.heartbeat import Heartbeat
from modelswap_sidecar.heartbeat.objects import parse_micro_time
from modelswap_sidecar.heartbeat.report import NodeReport
from modelswap_sidecar.heartbeat.settings import HeartbeatSettings
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, load_yaml
from tests.support.waiting import until_on_loop

T = TypeVar("T")

LEASES = "modelswap-node-leases"
NODE_NAME = "gpu-node-1"
GPU = GpuStatus(
    uuid="sim-0",
    ordinal=0,
    product="sim",
    hbm_total_bytes=1 << 30,
    hbm_reserved_bytes=1 << 26,
    per_process_overhead_bytes=1 << 20,
    link=Link(kind="sim", host_to_device_gbps=17.0, device_to_host_gbps=17.0),
)


class CountingCluster(KubeNodeCluster):
    """Counts the status writes the heartbeat sends (the emulator drops no-op writes, so
    the object's resourceVersion alone could not show that none were sent)."""

    def __init__(self, api: Any) -> None:
        super().__init__(api, timeout_seconds=5.0)
        self.status_writes = 0
        self.node_reads = 0

    async def read_node(self, name: str) -> dict[str, Any]:
        self.node_reads += 1
        return await super().read_node(name)

    async def replace_swapnode_status(self, name: str, status: Mapping[str, Any]) -> dict[str, Any]:
        # counted once the write has landed: a test reading the object after seeing the
        # count must find the write in it
        written = await super().replace_swapnode_status(name, status)
        self.status_writes += 1
        return written


@pytest.fixture
def cluster() -> Iterator[EmulatorThread]:
    with EmulatorThread() as api:
        api.create(load_yaml(REPO_ROOT / "crds" / "modelswap.io_swapnodes.yaml"))
        api.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASES}})
        api.create({
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {"name": NODE_NAME, "labels": {"pool": "h100", "kubernetes.io/os": "linux"}},
            "spec": {"taints": [{"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}]},
        })  # fmt: skip
        yield api


async def eventually(predicate: Callable[[], T], what: str) -> T:
    """`waiting.until_on_loop` at this file's pace (10 s; a look every 20 ms: many block
    the loop on a request to the API emulator)."""
    return await until_on_loop(predicate, what, 10.0, poll_seconds=0.02)


def settings(**overrides: Any) -> HeartbeatSettings:
    values: dict[str, Any] = {
        "node_name": NODE_NAME,
        "lease_namespace": LEASES,
        "holder_identity": "modelswap-node-abcde",
        "lease_duration_seconds": 1,
        "renew_interval_seconds": 0.1,
        "status_interval_seconds": 0.05,
        "min_status_write_interval_seconds": 0.0,
        "node_refresh_seconds": 0.2,
    }
    return HeartbeatSettings(**{**values, **overrides})


@pytest.mark.asyncio
async def test_swapnode_appears_with_node_labels_taints_owner_and_report(
    cluster: EmulatorThread,
) -> None:
    api = kube.api_client(str(cluster.kubeconfig_path))
    try:
        report = NodeReport(agent_version="0.1.0", endpoint="http://10.1.2.3:9443",
                            gateway_endpoint="http://10.1.2.3:8080",
                            gateway_grpc_endpoint="grpc://10.1.2.3:8081", gpus=(GPU,),
                            models=(HostedModel(uid="u-1", namespace="team-a", name="llama",
                                                state="Resident", gpu="sim-0",
                                                resident_bytes=1 << 20),))  # fmt: skip
        async with Heartbeat(settings(), KubeNodeCluster(api), lambda: report):
            swapnode = await eventually(
                lambda: (sn := kube.read_swapnode(api, NODE_NAME)) and sn.get("status") and sn,
                "the SwapNode with a status",
            )
        node = kube.read_node(api, NODE_NAME)
        assert swapnode["metadata"]["ownerReferences"] == [
            {"apiVersion": "v1", "kind": "Node", "name": NODE_NAME, "uid": node["metadata"]["uid"]}
        ]
        assert swapnode["spec"] == {"nodeName": NODE_NAME}
        status = swapnode["status"]
        assert status["nodeLabels"] == {"pool": "h100", "kubernetes.io/os": "linux"}
        assert status["nodeTaints"] == [
            {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
        ]
        assert status["agentVersion"] == "0.1.0" and status["endpoint"] == "http://10.1.2.3:9443"
        assert status["gatewayEndpoint"] == "http://10.1.2.3:8080"
        assert status["gatewayGrpcEndpoint"] == "grpc://10.1.2.3:8081"  # kept by the CRD
        assert status["gpus"] == [GPU.to_dict()]
        assert status["models"][0]["name"] == "llama" and status["models"][0]["state"] == "Resident"

        # Owned by the Node: deleting the Node collects the SwapNode.
        kube.client.CoreV1Api(api).delete_node(NODE_NAME)
        await eventually(lambda: kube.read_swapnode(api, NODE_NAME) is None, "the SwapNode gone")
    finally:
        api.close()


@pytest.mark.asyncio
async def test_status_is_written_only_when_something_changes(cluster: EmulatorThread) -> None:
    api = kube.api_client(str(cluster.kubeconfig_path))
    try:
        counting = CountingCluster(api)
        reports = [NodeReport(agent_version="0.1.0", gpus=(GPU,))]
        heartbeat = Heartbeat(settings(), counting, lambda: reports[-1])
        async with heartbeat:
            await eventually(lambda: counting.status_writes == 1, "the first status write")
            version = kube.read_swapnode(api, NODE_NAME)["metadata"]["resourceVersion"]  # type: ignore[index]
            # Three Node re-reads (each also re-reads the SwapNode) and many comparisons
            # later, nothing was sent.
            reads = counting.node_reads
            await eventually(lambda: counting.node_reads >= reads + 3, "three Node reads")
            assert counting.status_writes == 1 == heartbeat.status_writes
            assert kube.read_swapnode(api, NODE_NAME)["metadata"]["resourceVersion"] == version  # type: ignore[index]

            reports.append(NodeReport(agent_version="0.1.0", gpus=(GPU,),
                                      models=(HostedModel(uid="u-2", state="SwappedOut"),)))  # fmt: skip
            heartbeat.status_changed()
            await eventually(lambda: counting.status_writes == 2, "the second status write")
            changed = kube.read_swapnode(api, NODE_NAME)
            assert changed is not None and changed["status"]["models"] == [
                {"uid": "u-2", "state": "SwappedOut"}
            ]
            assert int(changed["metadata"]["resourceVersion"]) > int(version)

            # A label removed from the Node disappears from the status (the whole status is
            # replaced, not merged).
            kube.client.CoreV1Api(api).patch_node(
                NODE_NAME, {"metadata": {"labels": {"pool": None}}}
            )
            await eventually(
                lambda: "pool" not in kube.read_swapnode(api, NODE_NAME)["status"]["nodeLabels"],  # type: ignore[index]
                "the label gone from the status",
            )
            await eventually(
                lambda: counting.status_writes == 3, "the third status write"
            )  # counted as the call returns
            await asyncio.sleep(0.5)
            assert counting.status_writes == 3  # and only one write for it
    finally:
        api.close()


@pytest.mark.asyncio
async def test_lease_is_renewed_and_goes_stale_once_the_heartbeat_stops(
    cluster: EmulatorThread,
) -> None:
    api = kube.api_client(str(cluster.kubeconfig_path))
    try:
        renewals: list[float] = []
        heartbeat = Heartbeat(settings(), KubeNodeCluster(api), lambda: NodeReport(agent_version="0.1.0"),
                              on_renewed=lambda: renewals.append(time.monotonic()))  # fmt: skip

        def renew_time() -> datetime | None:
            lease = kube.read_lease(api, LEASES, NODE_NAME)
            return parse_micro_time(lease["spec"]["renewTime"]) if lease else None

        async with heartbeat:
            first = await eventually(renew_time, "a renewTime")
            await eventually(
                lambda: (t := renew_time()) is not None and t > first, "a later renewTime"
            )
            await eventually(lambda: len(renewals) >= 3, "three renewals")
            assert not heartbeat.renewals_failing
            lease = kube.read_lease(api, LEASES, NODE_NAME)
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == "modelswap-node-abcde"
            assert lease["spec"]["leaseDurationSeconds"] == 1
            assert lease["spec"].get("leaseTransitions", 0) == 0  # renewed, never re-acquired
        stopped = renew_time()
        assert stopped is not None
        # Once the lease duration has passed, nothing renewed it: it is stale.
        duration = lease["spec"]["leaseDurationSeconds"]
        await eventually(lambda: (datetime.now(UTC) - stopped).total_seconds() > duration + 0.2,
                         "the lease duration to pass")  # fmt: skip
        assert renew_time() == stopped
    finally:
        api.close()


@pytest.mark.asyncio
async def test_renewals_fail_while_the_api_server_is_away(tmp_path: Path) -> None:
    """Pointed at a port nobody listens on, renewals fail and say so (the fencing rule's
    input), without blocking the event loop."""
    from modelswap_sidecar.triton.process import free_loopback_port
    from tests.support.kube_emulator.server import kubeconfig

    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps(kubeconfig(f"http://127.0.0.1:{free_loopback_port()}", "token")))
    api = kube.api_client(str(path))
    try:
        heartbeat = Heartbeat(settings(), KubeNodeCluster(api, timeout_seconds=0.5),
                              lambda: NodeReport(agent_version="0.1.0"))  # fmt: skip
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        async with heartbeat:
            task = asyncio.create_task(ticker())
            await eventually(
                lambda: heartbeat.consecutive_renewal_failures >= 3, "three failed renewals"
            )
            task.cancel()
            assert heartbeat.renewals_failing and heartbeat.last_renewal_monotonic_seconds is None
            assert "unreachable" in (heartbeat.last_error or "")
            assert ticks >= 10, "the event loop was blocked by the API calls"
    finally:
        api.close()


def test_kube_helpers_translate_api_errors(cluster: EmulatorThread) -> None:
    api = kube.api_client(str(cluster.kubeconfig_path))
    try:
        with pytest.raises(kube.NotFound, match="get node nowhere: 404 NotFound"):
            kube.read_node(api, "nowhere")
        assert kube.read_lease(api, LEASES, "nowhere") is None
        body = {"metadata": {"name": "n1"}, "spec": {"holderIdentity": "a"}}
        created = kube.create_lease(api, LEASES, body)
        with pytest.raises(kube.Conflict) as exists:
            kube.create_lease(api, LEASES, body)
        assert exists.value.status == 409 and exists.value.reason == "AlreadyExists"
        renewed = kube.replace_lease(api, LEASES, {**created, "spec": {"holderIdentity": "b"}})
        assert renewed["spec"]["holderIdentity"] == "b"
        with pytest.raises(kube.Conflict):  # created's resourceVersion is stale now
            kube.replace_lease(api, LEASES, {**created, "spec": {"holderIdentity": "c"}})
        with pytest.raises(kube.KubeError) as invalid:  # the CRD schema: nodeName is a string
            kube.create_swapnode(api, {"apiVersion": "modelswap.io/v1alpha1", "kind": "SwapNode",
                                       "metadata": {"name": "x"}, "spec": {"nodeName": 5}})  # fmt: skip
        assert invalid.value.status == 422
    finally:
        api.close()

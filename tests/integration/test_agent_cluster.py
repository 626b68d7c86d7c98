"""The agent in cluster mode against the API emulator: real agent (`modelswap sidecar`),
real Triton, and the emulator in a thread of the test.

The agent's SwapNode appears with its Node's labels and taints, its GPUs, the models it
hosts and the control API's self-signed certificate, which a pinned client trusts; a
swap-out changes its status, and nothing else does (requests move lastRequestTime in 10 s
steps only); its Lease is renewed, the renewals keep it unfenced while the operator is
silent, and stopping the agent lets the Lease go stale."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from examples.models import reference
from modelswap_api import kube
from modelswap_api.tls import pinned_context
from modelswap_sidecar.heartbeat.objects import parse_micro_time
from tests.support.agent_harness import MIB, AgentConfig, entry, eventually, new_uid, node
from tests.support.kube_emulator.hosting import EmulatorThread
from tests.support.kube_testing import REPO_ROOT, load_yaml

pytestmark = pytest.mark.asyncio

LEASES = "modelswap-node-leases"
NODE = "node-a"  # the harness's nodeName
LABELS = {"pool": "sim", "kubernetes.io/os": "linux"}
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
LEASE_SECONDS = 2


@pytest.fixture
def cluster() -> Iterator[EmulatorThread]:
    with EmulatorThread() as emulator:
        emulator.create(load_yaml(REPO_ROOT / "crds" / "modelswap.io_swapnodes.yaml"))
        emulator.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": LEASES}})
        emulator.create({"apiVersion": "v1", "kind": "Node",
                         "metadata": {"name": NODE, "labels": LABELS},
                         "spec": {"taints": [TAINT]}})  # fmt: skip
        yield emulator


def cluster_config(emulator: EmulatorThread) -> AgentConfig:
    return AgentConfig(
        local_mode=False,
        grace_seconds=2.0,
        extra={
            "gpus": [
                {"uuid": "sim-gpu-0", "capacityBytes": 128 * MIB, "linkGBps": 12.5},
                {"uuid": "sim-gpu-1", "capacityBytes": 128 * MIB},  # measured
            ],
            "kube": {
                "kubeconfig": str(emulator.kubeconfig_path),
                "leaseNamespace": LEASES,
                "holderIdentity": "modelswap-node-test",
                "advertiseHost": "127.0.0.1",
                "leaseDurationSeconds": LEASE_SECONDS,
                "renewIntervalSeconds": 0.2,
                # Every write must come from a comparison the agent asked for.
                "statusIntervalSeconds": 600,
                "minStatusWriteIntervalSeconds": 0,
                "nodeRefreshSeconds": 600,
            },
        },
    )


@pytest.mark.timeout(120)
async def test_swapnode_status_follows_the_models_and_the_lease_goes_stale_after_stop(
    tmp_path: Path, cluster: EmulatorThread
) -> None:
    api = kube.api_client(str(cluster.kubeconfig_path))

    def swapnode() -> dict[str, Any]:
        return kube.read_swapnode(api, NODE) or {}

    def status() -> dict[str, Any]:
        found: dict[str, Any] = swapnode().get("status") or {}
        return found

    def version() -> int:
        return int(swapnode()["metadata"]["resourceVersion"])

    def renew_time() -> datetime | None:
        lease = kube.read_lease(api, LEASES, NODE)
        return parse_micro_time(lease["spec"]["renewTime"]) if lease else None

    async def renewals(count: int) -> None:
        """Wait until the Lease was renewed `count` more times (many report comparisons)."""
        for _ in range(count):
            before = renew_time()
            await eventually(
                lambda b=before: _async((t := renew_time()) is not None and (b is None or t > b)),
                timeout_seconds=10,
                what="a Lease renewal",
            )

    try:
        async with node(tmp_path, cluster_config(cluster)) as n:
            _triton, agent, control, models = n.parts()

            # The SwapNode: the Node's labels, taints and uid; GPUs; no models yet.
            first = await eventually(lambda: _async(status().get("gpus")), what="SwapNode")
            sn, st = swapnode(), status()
            node_uid = kube.read_node(api, NODE)["metadata"]["uid"]
            assert sn["metadata"]["ownerReferences"] == [
                {"apiVersion": "v1", "kind": "Node", "name": NODE, "uid": node_uid}
            ]
            assert st["nodeLabels"] == LABELS and st["nodeTaints"] == [TAINT]
            assert st["agentVersion"]

            # The control API serves HTTPS with a certificate the agent made at start and
            # publishes here: a client pinned to it gets in; the system CAs and plain HTTP
            # do not.
            endpoint = f"https://127.0.0.1:{agent.control_port}"
            assert st["endpoint"] == endpoint
            assert st["certificate"].startswith("-----BEGIN CERTIFICATE-----")
            async with httpx.AsyncClient(trust_env=False) as unpinned:
                with pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"):
                    await unpinned.get(f"{endpoint}/v1/node")
                with pytest.raises(httpx.TransportError):
                    await unpinned.get(f"http://127.0.0.1:{agent.control_port}/v1/node")
            await control.switch_to(endpoint, verify=pinned_context(st["certificate"]))
            assert (await control.client.get("/v1/node")).json()["nodeName"] == NODE
            assert [g["uuid"] for g in first] == ["sim-gpu-0", "sim-gpu-1"]
            gpu0 = first[0]
            assert gpu0["hbmTotalBytes"] == 128 * MIB and gpu0["hbmFreeBytes"] == 128 * MIB
            assert gpu0["hostStoreCapacityBytes"] == 1 << 30
            assert gpu0["link"] == {"kind": "sim", "hostToDeviceGBps": 12.5,
                                    "deviceToHostGBps": 12.5}  # fmt: skip
            assert first[1]["link"]["kind"] == "sim" and first[1]["link"]["hostToDeviceGBps"] > 0
            assert not st.get("models")

            # A model loads: it appears in the status, resident, its HBM taken.
            uid = new_uid()
            await control.desired([entry(uid, swap_policy={"idleAfter": "never"})])
            await control.wait_state(uid, "Resident")

            def hosted() -> dict[str, Any]:
                found: dict[str, Any] = (status().get("models") or [{}])[0]
                return found

            await eventually(lambda: _async(hosted().get("state") == "Resident"), what="Resident")
            model = hosted()
            assert model["uid"] == uid and model["name"] == "mlp"
            assert model["namespace"] == "default" and model["residentBytes"] == 32 * MIB
            # What the operator copies into the ModelDeployment's status.
            assert model["generation"] == 1 and model["desired"] is True
            assert model["reason"] == "Loaded" and model["hostBytes"] == 32 * MIB
            assert model["swapIns"] == 0 and model["swapOuts"] == 0
            assert "lastRequestTime" not in model and "lastSwapInSeconds" not in model
            gpu = model["gpu"]
            placed = next(g for g in status()["gpus"] if g["uuid"] == gpu)
            assert placed["hbmFreeBytes"] < 128 * MIB
            x = reference.mlp_input(5)
            before = await models.mlp(uid, x)

            # The first request shows as lastRequestTime (one write); more requests within
            # LAST_REQUEST_STEP_SECONDS of it leave the status alone, though the control
            # API has their exact time.
            shown = await eventually(
                lambda: _async(hosted().get("lastRequestTime")), what="lastRequestTime"
            )
            settled = version()
            await models.mlp(uid, x)

            async def exact_time() -> str | None:
                found = (await control.model(uid)).get("lastRequestTime")
                return found if found is not None and found > shown else None

            await eventually(exact_time, what="the second request's time")
            await renewals(5)
            assert version() == settled
            assert hosted()["lastRequestTime"] == shown

            # A swap-out changes it: the model is SwappedOut, its HBM free again.
            out = await control.swap(uid, "out")
            assert out.json()["outcome"] == "completed", out.text
            await eventually(
                lambda: _async(hosted().get("state") == "SwappedOut"), what="SwappedOut"
            )
            assert hosted()["residentBytes"] == 0
            assert hosted()["swapOuts"] == 1 and hosted()["hostBytes"] == 32 * MIB
            swapped = next(g for g in status()["gpus"] if g["uuid"] == gpu)
            assert swapped["hbmFreeBytes"] == 128 * MIB and swapped["hostStoreBytes"] > 0
            assert version() > settled
            settled = version()
            await renewals(3)
            assert version() == settled

            # The operator has been silent past the grace period, but the Lease renewals
            # keep the agent unfenced: a swap-in is still allowed.
            last_push = time.monotonic()
            await eventually(
                lambda: _async(time.monotonic() - last_push > 2.5), what="grace period"
            )
            await renewals(1)
            assert (await control.client.get("/v1/node")).json()["fenced"] is False
            back = await control.swap(uid, "in")
            assert back.json()["outcome"] == "completed", back.text
            assert np.array_equal((await models.mlp(uid, x)).output, before.output)
            await eventually(lambda: _async(hosted().get("state") == "Resident"), what="back")
            assert hosted()["swapIns"] == 1 and hosted()["lastSwapInSeconds"] > 0

            # The Lease: held by the agent, renewed; stale once the agent stops.
            lease = kube.read_lease(api, LEASES, NODE)
            assert lease is not None
            assert lease["spec"]["holderIdentity"] == "modelswap-node-test"
            assert lease["spec"]["leaseDurationSeconds"] == LEASE_SECONDS
            assert await agent.stop() == 0
            stopped = renew_time()
            assert stopped is not None
            await eventually(
                lambda: _async((datetime.now(UTC) - stopped).total_seconds() > LEASE_SECONDS + 0.5),
                what="the lease duration to pass",
            )
            assert renew_time() == stopped, "a stopped agent renewed its Lease"
    finally:
        api.close()


async def _async(value: Any) -> Any:
    return value

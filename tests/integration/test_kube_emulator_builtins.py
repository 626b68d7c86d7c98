"""The emulator in-process on the test's own event loop, with an aiohttp client, and the
built-in types the operator and agents write: Leases, Nodes, Events, Secrets, Services,
EndpointSlices."""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio

from tests.support.kube_emulator.server import KubeEmulator


@pytest_asyncio.fixture
async def http() -> AsyncIterator[tuple[str, aiohttp.ClientSession]]:
    async with KubeEmulator() as api, aiohttp.ClientSession() as session:
        yield api.url, session


async def call(
    http: tuple[str, aiohttp.ClientSession], method: str, path: str, body: Any = None,
    content_type: str = "application/json",
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    url, session = http
    data = None if body is None else json.dumps(body)
    headers = {"Content-Type": content_type}
    async with session.request(method, f"{url}{path}", data=data, headers=headers) as response:
        return response.status, await response.json()


LEASES = "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases"


@pytest.mark.asyncio
async def test_leases_take_unconditional_and_conditional_updates(
    http: tuple[str, aiohttp.ClientSession],
) -> None:
    lease = {
        "metadata": {"name": "node-a"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 10},
    }
    code, made = await call(http, "POST", LEASES, lease)
    assert code == 201 and made["kind"] == "Lease"
    renewed = dict(lease, spec={**lease["spec"], "renewTime": "2026-01-01T00:00:00.000000Z"})
    code, put = await call(http, "PUT", f"{LEASES}/node-a", renewed)  # no resourceVersion: allowed
    assert code == 200 and put["spec"]["renewTime"].startswith("2026-01-01")
    stale = dict(
        renewed, metadata={"name": "node-a", "resourceVersion": made["metadata"]["resourceVersion"]}
    )
    code, status = await call(http, "PUT", f"{LEASES}/node-a", stale)
    assert code == 409 and status["reason"] == "Conflict"


@pytest.mark.asyncio
async def test_nodes_keep_status_given_on_create_and_status_writes_go_to_status(
    http: tuple[str, aiohttp.ClientSession],
) -> None:
    node = {"metadata": {"name": "gpu-1", "labels": {"pool": "a"}},
            "status": {"capacity": {"nvidia.com/gpu": "1"}}}  # fmt: skip
    code, made = await call(http, "POST", "/api/v1/nodes", node)
    assert code == 201 and made["status"]["capacity"] == {"nvidia.com/gpu": "1"}
    assert "namespace" not in made["metadata"]
    code, patched = await call(
        http, "PATCH", "/api/v1/nodes/gpu-1/status",
        {"status": {"conditions": [{"type": "Ready", "status": "True"}]}},
        "application/strategic-merge-patch+json",
    )  # fmt: skip
    assert code == 200 and patched["status"]["conditions"][0]["type"] == "Ready"
    assert patched["status"]["capacity"] == {"nvidia.com/gpu": "1"}
    code, _ = await call(http, "GET", "/api/v1/namespaces/default/nodes/gpu-1")
    assert code == 404  # cluster-scoped: no namespaced path


@pytest.mark.asyncio
async def test_events_select_by_involved_object(http: tuple[str, aiohttp.ClientSession]) -> None:
    for name, target in (("e1", "a"), ("e2", "b")):
        event = {"metadata": {"name": name}, "involvedObject": {"kind": "ModelDeployment", "name": target},
                 "reason": "Placed", "message": "m", "type": "Normal"}  # fmt: skip
        assert (await call(http, "POST", "/api/v1/namespaces/default/events", event))[0] == 201
    code, listed = await call(
        http, "GET", "/api/v1/namespaces/default/events?fieldSelector=involvedObject.name%3Db"
    )
    assert code == 200 and [e["metadata"]["name"] for e in listed["items"]] == ["e2"]
    assert listed["kind"] == "EventList" and "kind" not in listed["items"][0]


@pytest.mark.asyncio
async def test_secret_string_data_becomes_base64_data(
    http: tuple[str, aiohttp.ClientSession],
) -> None:
    secret = {"metadata": {"name": "token"}, "stringData": {"token": "s3cret"}}
    code, made = await call(http, "POST", "/api/v1/namespaces/default/secrets", secret)
    assert code == 201 and "stringData" not in made
    assert base64.b64decode(made["data"]["token"]) == b"s3cret" and made["type"] == "Opaque"


@pytest.mark.asyncio
async def test_services_get_a_cluster_ip_and_endpoint_slices_are_stored(
    http: tuple[str, aiohttp.ClientSession],
) -> None:
    svc = {"metadata": {"name": "llama"}, "spec": {"ports": [{"name": "http", "port": 8000}]}}
    code, made = await call(http, "POST", "/api/v1/namespaces/default/services", svc)
    assert code == 201 and made["spec"]["clusterIP"].startswith("10.96.")
    assert made["spec"]["ports"][0] == {
        "name": "http",
        "port": 8000,
        "protocol": "TCP",
        "targetPort": 8000,
    }
    code, merged = await call(
        http, "PATCH", "/api/v1/namespaces/default/services/llama",
        {"metadata": {"labels": {"a": "b"}}}, "application/merge-patch+json",
    )  # fmt: skip
    assert merged["spec"]["clusterIP"] == made["spec"]["clusterIP"]
    slice_ = {"metadata": {"name": "llama-1", "labels": {"kubernetes.io/service-name": "llama"}},
              "addressType": "IPv4", "endpoints": [{"addresses": ["10.0.0.5"]}],
              "ports": [{"name": "http", "port": 9000}]}  # fmt: skip
    slices = "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices"
    assert (await call(http, "POST", slices, slice_))[0] == 201
    code, listed = await call(
        http, "GET", f"{slices}?labelSelector=kubernetes.io%2Fservice-name%3Dllama"
    )
    assert [s["endpoints"][0]["addresses"] for s in listed["items"]] == [["10.0.0.5"]]

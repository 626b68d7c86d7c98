"""Router: a model never routed gets its Service and EndpointSlice created at once (one
call each); when a create finds an object there, it is read and handled as before: ours
and the same is kept, ours and different is updated, not ours is reported."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from modelswap_api import kube
from modelswap_operator import routing

pytestmark = pytest.mark.asyncio
OWNER = {"apiVersion": "modelswap.io/v1alpha1", "kind": "ModelDeployment", "name": "m1",
         "uid": "00000000-0000-4000-8000-000000000001"}  # fmt: skip
GATEWAY = routing.Gateway("10.0.0.7", 8080)


class FakeIO:
    """`KubeIO.call` over a dict of objects by (kind, name); every call recorded."""

    def __init__(self, existing: dict[tuple[str, str], dict[str, Any]] | None = None) -> None:
        self.objects = dict(existing or {})
        self.calls: list[str] = []

    async def call(self, helper: Callable[..., Any], *args: Any) -> Any:
        name = helper.__name__
        self.calls.append(name)
        kind = "Service" if name.endswith("_service") else "EndpointSlice"
        if name.startswith("read_"):
            return self.objects.get((kind, args[1]))
        if name.startswith("create_"):
            body = args[1]
            key = (kind, body["metadata"]["name"])
            if key in self.objects:
                raise kube.Conflict(f"{kind} {key[1]} already exists", status=409)
            self.objects[key] = body
            return body
        if name in ("patch_service", "replace_endpoint_slice"):
            return {}
        raise AssertionError(f"unexpected call {name}")


def existing(*, ours: bool, port: int = GATEWAY.port) -> dict[tuple[str, str], dict[str, Any]]:
    gateway = routing.Gateway(GATEWAY.host, port)
    service = routing.service_body("default", OWNER, gateway)
    slice_ = routing.endpoint_slice_body("default", OWNER, gateway, "node-a", ready=True)
    for body in (service, slice_):
        body["metadata"]["resourceVersion"] = "7"
        if not ours:
            body["metadata"]["labels"] = {}
    return {("Service", "m1"): service, ("EndpointSlice", "m1-modelswap"): slice_}


async def test_a_new_model_costs_one_create_each_and_nothing_more_when_unchanged() -> None:
    io = FakeIO()
    router = routing.Router(io)  # type: ignore[arg-type]
    await router.ensure("default", OWNER, GATEWAY, "node-a", True, new=True)
    assert io.calls == ["create_service", "create_endpoint_slice"]
    await router.ensure("default", OWNER, GATEWAY, "node-a", True, new=True)
    assert io.calls == ["create_service", "create_endpoint_slice"]


async def test_a_create_that_finds_our_objects_reads_them_and_updates_what_differs() -> None:
    io = FakeIO(existing(ours=True, port=9090))
    router = routing.Router(io)  # type: ignore[arg-type]
    await router.ensure("default", OWNER, GATEWAY, "node-a", True, new=True)
    assert io.calls == [
        "create_service", "read_service", "patch_service",
        "create_endpoint_slice", "read_endpoint_slice", "replace_endpoint_slice",
    ]  # fmt: skip


async def test_a_create_that_finds_our_same_objects_keeps_them() -> None:
    io = FakeIO(existing(ours=True))
    router = routing.Router(io)  # type: ignore[arg-type]
    await router.ensure("default", OWNER, GATEWAY, "node-a", True, new=True)
    assert io.calls == [
        "create_service",
        "read_service",
        "create_endpoint_slice",
        "read_endpoint_slice",
    ]


async def test_a_create_that_finds_a_service_not_ours_reports_it() -> None:
    io = FakeIO(existing(ours=False))
    router = routing.Router(io)  # type: ignore[arg-type]
    with pytest.raises(routing.RouteError, match="not managed by modelswap"):
        await router.ensure("default", OWNER, GATEWAY, "node-a", True, new=True)
    assert io.calls == ["create_service", "read_service"]


async def test_a_model_routed_before_is_read_first() -> None:
    io = FakeIO(existing(ours=True))
    router = routing.Router(io)  # type: ignore[arg-type]
    await router.ensure("default", OWNER, GATEWAY, "node-a", True)
    assert io.calls == ["read_service", "read_endpoint_slice"]


async def test_a_node_serving_grpc_gets_a_second_port_with_app_protocol_grpc() -> None:
    status = {
        "gatewayEndpoint": "http://10.0.0.7:8080",
        "gatewayGrpcEndpoint": "grpc://10.0.0.7:8081",
    }
    gateway = routing.Gateway.of_node(status)
    assert gateway == routing.Gateway("10.0.0.7", 8080, 8081)
    service = routing.service_body("default", OWNER, gateway)
    assert service["spec"]["ports"] == [
        {"name": "http", "port": 80, "targetPort": 8080, "protocol": "TCP"},
        {
            "name": "grpc",
            "port": 8001,
            "targetPort": 8081,
            "protocol": "TCP",
            "appProtocol": "grpc",
        },
    ]
    slice_ = routing.endpoint_slice_body("default", OWNER, gateway, "node-a", ready=True)
    assert slice_["ports"] == [
        {"name": "http", "port": 8080, "protocol": "TCP"},
        {"name": "grpc", "port": 8081, "protocol": "TCP", "appProtocol": "grpc"},
    ]
    # a node without the gRPC front (or naming another host for it): HTTP only, as before
    for other in ({"gatewayEndpoint": "http://10.0.0.7:8080"},
                  {**status, "gatewayGrpcEndpoint": "grpc://10.0.0.9:8081"}):  # fmt: skip
        plain = routing.Gateway.of_node(other)
        assert plain == GATEWAY
        assert [
            p["name"] for p in routing.service_body("default", OWNER, plain)["spec"]["ports"]
        ] == ["http"]
    assert routing.Gateway.of_node({}) is None
    # the node starting to serve gRPC changes what is written: the router updates both
    io = FakeIO(existing(ours=True))
    router = routing.Router(io)  # type: ignore[arg-type]
    await router.ensure("default", OWNER, gateway, "node-a", True, new=True)
    assert "patch_service" in io.calls and "replace_endpoint_slice" in io.calls

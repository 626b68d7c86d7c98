"""The gateway's gRPC front without Triton: how its refusals reach a client (code, reason,
retry information), a Triton that does not answer, a failed swap-in, readiness before the
node knows its models, and a port that cannot be bound."""

from __future__ import annotations

import contextlib
import socket
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway.app import make_app
from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.gateway_fakes import FakeDirectory, refuse, route
from tests.support.waiting import until_on_loop

NS = (("modelswap-namespace", "team-a"),)


@dataclass
class Front:
    front: GrpcFront
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    registry: CollectorRegistry


@contextlib.asynccontextmanager
async def grpc_front(directory: FakeDirectory) -> AsyncIterator[Front]:
    """The front over a gateway whose Triton (HTTP and gRPC) is a port nobody listens on."""
    registry = CollectorRegistry()
    dead = free_loopback_port()
    settings = GatewaySettings(upstream_url=f"http://127.0.0.1:{dead}", retry_after_seconds=2)
    app = make_app(directory, settings, registry=registry)
    front = GrpcFront(
        app.gateway, GrpcSettings(upstream_target=f"127.0.0.1:{dead}", host="127.0.0.1", port=0)
    )
    port = await front.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield Front(front, service_pb2_grpc.GRPCInferenceServiceStub(channel), registry)
    finally:
        await front.stop()
        await app.gateway.queues.close()


def infer(model: str) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    request.raw_input_contents.append(b"\0\0\0\0")
    return request


@pytest.mark.asyncio
async def test_triton_not_answering_is_unavailable_with_retry_information() -> None:
    plain = route("plain", "team-a")
    directory = FakeDirectory([plain], resident=[plain.uid])
    async with grpc_front(directory) as f:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await f.stub.ModelInfer(infer("plain"), metadata=NS, timeout=30)
        labels = {"uid": plain.uid, "namespace": "team-a", "model": "plain", "code": "503"}
        # the status can reach the client before the handler has counted the call
        await until_on_loop(
            lambda: f.registry.get_sample_value("modelswap_gateway_requests_total", labels) == 1,
            "the refusal counted",
        )
    e = caught.value
    trailing = dict(e.trailing_metadata() or ())
    assert e.code() == grpc.StatusCode.UNAVAILABLE, e
    assert trailing["modelswap-reason"] == "UpstreamUnavailable"
    assert trailing["retry-after"] == "2" and trailing["grpc-retry-pushback-ms"] == "2000"
    assert directory.in_flight[plain.uid] == 0  # counted while admitted, then finished


@pytest.mark.asyncio
async def test_a_failed_swap_in_is_unavailable_with_its_reason_and_retry_after() -> None:
    plain = route("plain", "team-a")
    directory = FakeDirectory([plain])
    directory.failure[plain.uid] = refuse("no room on the node")
    async with grpc_front(directory) as f:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await f.stub.ModelInfer(infer("team-a/plain"), timeout=30)
    e = caught.value
    trailing = dict(e.trailing_metadata() or ())
    assert e.code() == grpc.StatusCode.UNAVAILABLE and "no room on the node" in (e.details() or "")
    assert trailing["modelswap-reason"] == "SwapInFailed" and trailing["retry-after"] == "7"
    assert directory.swap_ins[plain.uid] == 1


@pytest.mark.asyncio
async def test_not_ready_until_the_node_knows_its_models_and_unknown_models() -> None:
    directory = FakeDirectory([])
    directory.knows = False
    async with grpc_front(directory) as f:
        ready = await f.stub.ServerReady(service_pb2.ServerReadyRequest(), timeout=30)
        live = await f.stub.ServerLive(service_pb2.ServerLiveRequest(), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as unknown:
            await f.stub.ModelReady(service_pb2.ModelReadyRequest(name="team-a/nope"), timeout=30)
        with pytest.raises(grpc.aio.AioRpcError) as trace:
            await f.stub.TraceSetting(service_pb2.TraceSettingRequest(), timeout=30)
    assert live.live and not ready.ready
    assert unknown.value.code() == grpc.StatusCode.NOT_FOUND
    assert dict(unknown.value.trailing_metadata() or ())["modelswap-reason"] == "ModelNotFound"
    assert trace.value.code() == grpc.StatusCode.UNIMPLEMENTED


@pytest.mark.asyncio
async def test_a_port_taken_is_an_error_naming_it() -> None:
    directory = FakeDirectory([])
    app = make_app(directory, GatewaySettings(upstream_url="http://127.0.0.1:1"),
                   registry=CollectorRegistry())  # fmt: skip
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        front = GrpcFront(
            app.gateway, GrpcSettings(upstream_target="127.0.0.1:1", host="127.0.0.1", port=port)
        )
        with pytest.raises((OSError, RuntimeError), match=str(port)):
            await front.start()
    await front.stop()

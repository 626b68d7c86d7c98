"""The gRPC front bounds what a `ModelInferRequest` may make Triton allocate as the HTTP
front bounds a v2 body (docs/GATEWAY.md, "What a v2 request may make Triton allocate"):
each refusal is INVALID_ARGUMENT with HTTP's message naming the input, counted as HTTP's
400, before any swap-in, and never reaches Triton (a fake gRPC Triton that records every
request it gets). A legal request at `max_batch_size` still answers; `ServerMetadata`
lists only the extensions the front serves."""

from __future__ import annotations

import contextlib
import struct
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from prometheus_client import CollectorRegistry
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway import grpc_tensors
from modelswap_sidecar.gateway.app import make_app
from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.errors import BadRequestError
from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from modelswap_sidecar.gateway.settings import GatewaySettings
from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.gateway_fakes import FakeDirectory, route
from tests.support.waiting import until_on_loop

NS = (("modelswap-namespace", "team-a"),)
MAX_BATCH = 8
#: Every extension Triton 2.51 lists.
TRITON_EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging", "generate",
]  # fmt: skip


def config(triton_name: str) -> dict[str, Any]:
    """Triton's JSON configuration of the test model, as `GET .../config` gives it."""
    return {
        "name": triton_name,
        "max_batch_size": MAX_BATCH,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]},
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [-1]},
        ],
    }


@dataclass
class FakeTriton(service_pb2_grpc.GRPCInferenceServiceServicer):  # type: ignore[misc]
    """Triton's gRPC service as far as these tests need it: every inference request it
    gets is recorded and echoed."""

    got: list[service_pb2.ModelInferRequest] = field(default_factory=list)

    async def ModelInfer(self, request: Any, context: Any) -> Any:  # noqa: N802
        self.got.append(request)
        return service_pb2.ModelInferResponse(model_name=request.model_name, id=request.id)

    async def ModelStreamInfer(self, requests: Any, context: Any) -> Any:  # noqa: N802
        async for request in requests:
            self.got.append(request)
            yield service_pb2.ModelStreamInferResponse(
                infer_response=service_pb2.ModelInferResponse(
                    model_name=request.model_name, id=request.id
                )
            )

    async def ServerMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
        return service_pb2.ServerMetadataResponse(
            name="triton", version="2.51.0", extensions=TRITON_EXTENSIONS
        )


@dataclass
class World:
    stub: service_pb2_grpc.GRPCInferenceServiceStub
    triton: FakeTriton
    directory: FakeDirectory
    registry: CollectorRegistry
    model: ModelRoute

    def count(self, code: str) -> float | None:
        labels = {"uid": self.model.uid, "namespace": "team-a", "model": "m", "code": code}
        return self.registry.get_sample_value("modelswap_gateway_requests_total", labels)


@contextlib.asynccontextmanager
async def world(*, resident: bool = False) -> AsyncIterator[World]:
    """The front over the fake Triton's gRPC port; the model `team-a/m` swapped out (unless
    `resident`) with its configuration already read (as while Triton still holds it)."""
    triton = FakeTriton()
    server = grpc.aio.server()
    service_pb2_grpc.add_GRPCInferenceServiceServicer_to_server(triton, server)
    triton_port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    model = route("m", "team-a")
    directory = FakeDirectory([model], resident=[model.uid] if resident else [])
    registry = CollectorRegistry()
    dead = free_loopback_port()  # Triton's HTTP port: never read, the configuration is known
    app = make_app(directory, GatewaySettings(upstream_url=f"http://127.0.0.1:{dead}"),
                   registry=registry)  # fmt: skip
    app.gateway.model_configs.put(model.triton_name, config(model.triton_name))
    front = GrpcFront(
        app.gateway,
        GrpcSettings(upstream_target=f"127.0.0.1:{triton_port}", host="127.0.0.1", port=0),
    )
    port = await front.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            yield World(stub, triton, directory, registry, model)
    finally:
        await front.stop()
        await app.gateway.queues.close()
        await server.stop(None)


def fp32(shape: list[int], raw: bytes) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="m", id="r1")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=shape)
    request.raw_input_contents.append(raw)
    return request


def strings(*values: bytes) -> bytes:
    return b"".join(struct.pack("<I", len(v)) + v for v in values)


async def refused(w: World, request: service_pb2.ModelInferRequest) -> str:
    """The refusal's message; checks it is HTTP's 400, counted, before any swap-in, and
    that Triton got nothing."""
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await w.stub.ModelInfer(request, metadata=NS, timeout=30)
    e = caught.value
    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
    assert dict(e.trailing_metadata() or ())["modelswap-reason"] == "BadRequest"
    # the status can reach the client before the handler has counted the call
    await until_on_loop(lambda: w.count("400") == 1, "the refusal counted as HTTP's 400")
    assert w.triton.got == []
    assert w.directory.swap_ins[w.model.uid] == 0
    assert w.directory.in_flight[w.model.uid] == 0
    return e.details() or ""


@pytest.mark.asyncio
async def test_the_crashing_shape_with_4_bytes_is_refused_naming_the_input() -> None:
    async with world() as w:
        message = await refused(w, fp32([1000000, 1000000], b"\0\0\0\0"))
    assert message == (
        "input 'INPUT0': shape [1000000, 1000000] of FP32 is 4000000000000 bytes, but "
        "raw_input_contents[0] is 4 bytes"
    )


@pytest.mark.asyncio
async def test_raw_contents_shorter_than_the_shape_needs() -> None:
    async with world() as w:
        message = await refused(w, fp32([MAX_BATCH, 2], b"\0" * (MAX_BATCH * 2 * 4 - 4)))
    assert "input 'INPUT0': shape [8, 2] of FP32 is 64 bytes, but raw_input_contents[0] is 60" in (
        message
    )


@pytest.mark.asyncio
async def test_typed_contents_fewer_than_the_shape_holds() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1000000, 1000000])
    tensor.contents.fp32_contents.append(1.0)
    async with world() as w:
        message = await refused(w, request)
    assert message == (
        "input 'INPUT0': shape [1000000, 1000000] holds 1000000000000 elements, but "
        "fp32_contents has 1"
    )


@pytest.mark.asyncio
async def test_bytes_whose_length_prefixes_lie() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 2])
    # the second string's prefix says 4 GiB - 1 of a 7-byte entry
    request.raw_input_contents.append(strings(b"ab") + b"\xff\xff\xff\xff" + b"c")
    async with world() as w:
        message = await refused(w, request)
    assert message.startswith("input 'TEXT': string 1's length prefix says 4294967295 bytes")


@pytest.mark.asyncio
async def test_bytes_with_fewer_strings_than_the_shape_holds() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[1, 1000000])
    request.raw_input_contents.append(strings(b"ab"))
    async with world() as w:
        message = await refused(w, request)
    assert "holds 1000000 elements, but raw_input_contents[0] (length-prefixed strings) has 1" in (
        message
    )


@pytest.mark.asyncio
async def test_a_batch_past_max_batch_size() -> None:
    async with world() as w:
        message = await refused(w, fp32([MAX_BATCH + 1, 2], b"\0" * ((MAX_BATCH + 1) * 8)))
    assert message == (
        "input 'INPUT0': shape [9, 2] has a batch of 9; m takes at most 8 (shape [batch, *[2]])"
    )


@pytest.mark.asyncio
async def test_dims_the_configuration_does_not_allow() -> None:
    async with world() as w:
        message = await refused(w, fp32([1, 3], b"\0" * 12))
    assert message == "input 'INPUT0': shape [1, 3] does not fit m's dims [-1, 2]"


@pytest.mark.asyncio
@pytest.mark.parametrize("on", ["input", "output"])
async def test_shared_memory_is_refused_with_https_message(on: str) -> None:
    request = fp32([1, 2], b"\0" * 8)
    tensor = request.inputs[0] if on == "input" else request.outputs.add(name="OUTPUT0")
    tensor.parameters["shared_memory_region"].string_param = "the-node's-region"
    tensor.parameters["shared_memory_byte_size"].int64_param = 8
    async with world() as w:
        message = await refused(w, request)
    name = "INPUT0" if on == "input" else "OUTPUT0"
    assert message == (
        f"{on} '{name}': shared memory (shared_memory_region) is not served through the "
        "gateway; send the data in the body"
    )


@pytest.mark.asyncio
async def test_a_parameter_triton_reads_of_the_wrong_type() -> None:
    request = fp32([1, 2], b"\0" * 8)
    request.parameters["sequence_start"].string_param = "yes"
    async with world() as w:
        message = await refused(w, request)
    assert message == "parameters.sequence_start: must be true or false"


@pytest.mark.asyncio
async def test_a_legal_request_at_max_batch_size_answers() -> None:
    request = fp32([MAX_BATCH, 2], b"\0" * (MAX_BATCH * 2 * 4))
    request.inputs.add(name="TEXT", datatype="BYTES", shape=[MAX_BATCH, 1])
    request.raw_input_contents.append(strings(*[b"x" * i for i in range(MAX_BATCH)]))
    request.parameters["sequence_start"].bool_param = True
    async with world() as w:
        response = await w.stub.ModelInfer(request, metadata=NS, timeout=30)
        assert response.model_name == "m" and response.id == "r1"
        assert [r.model_name for r in w.triton.got] == [w.model.triton_name]
        assert w.directory.swap_ins[w.model.uid] == 1  # swapped in, then forwarded
        await until_on_loop(lambda: w.count("200") == 1, "the answer counted")


@pytest.mark.asyncio
async def test_a_stream_answers_a_refusal_in_it_and_forwards_the_rest() -> None:
    async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
        bad = fp32([1000000, 1000000], b"\0\0\0\0")
        bad.id = "bad"
        yield bad
        good = fp32([1, 2], b"\0" * 8)
        good.id = "good"
        yield good

    async with world(resident=True) as w:
        answers = [a async for a in w.stub.ModelStreamInfer(requests(), metadata=NS, timeout=30)]
        assert [r.id for r in w.triton.got] == ["good"]
        await until_on_loop(lambda: w.count("400") == 1, "the refusal counted")
    assert [a.infer_response.id for a in answers] == ["bad", "good"]
    assert answers[0].error_message == (
        "BadRequest: input 'INPUT0': shape [1000000, 1000000] of FP32 is 4000000000000 bytes, "
        "but raw_input_contents[0] is 4 bytes"
    )
    assert answers[1].error_message == ""


@pytest.mark.asyncio
async def test_server_metadata_lists_only_what_the_grpc_front_serves() -> None:
    async with world() as w:
        answer = await w.stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=30)
    assert list(answer.extensions) == [
        "classification", "sequence", "schedule_policy", "model_configuration",
        "binary_tensor_data", "parameters", "statistics",
    ]  # fmt: skip


def message_of(request: service_pb2.ModelInferRequest) -> str:
    with pytest.raises(BadRequestError) as caught:
        grpc_tensors.infer_request(request)
    return caught.value.message


def test_how_a_message_carries_its_data_is_refused_when_inconsistent() -> None:
    two = service_pb2.ModelInferRequest(model_name="m")
    two.inputs.add(name="A", datatype="FP32", shape=[1])
    two.inputs.add(name="B", datatype="FP32", shape=[1])
    two.raw_input_contents.append(b"\0" * 4)
    assert message_of(two).startswith("raw_input_contents has 1 entries for 2 inputs")

    both = fp32([1], b"\0" * 4)
    both.inputs[0].contents.fp32_contents.append(1.0)
    assert (
        message_of(both) == "input 'INPUT0': carries both raw_input_contents[0] and fp32_contents"
    )

    other = service_pb2.ModelInferRequest(model_name="m")
    other.inputs.add(name="INPUT0", datatype="FP32", shape=[1]).contents.int_contents.append(1)
    assert message_of(other) == "input 'INPUT0': FP32 data goes in fp32_contents, not int_contents"

    half = service_pb2.ModelInferRequest(model_name="m")
    half.inputs.add(name="H", datatype="FP16", shape=[1])
    assert message_of(half) == "input 'H': carries neither typed contents nor raw_input_contents"

    cut = service_pb2.ModelInferRequest(model_name="m")
    cut.inputs.add(name="T", datatype="BYTES", shape=[2])
    cut.raw_input_contents.append(strings(b"ab") + b"\1\0")
    assert message_of(cut).startswith("input 'T': its BYTES data ends inside a 4-byte length")

    twice = fp32([1], b"\0" * 4)
    twice.inputs.add(name="INPUT0", datatype="FP32", shape=[1])
    twice.raw_input_contents.append(b"\0" * 4)
    assert message_of(twice) == "input 'INPUT0' is given more than once"


def test_typed_contents_and_parameters_that_fit_pass() -> None:
    request = service_pb2.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name="T", datatype="BYTES", shape=[2, 1])
    tensor.contents.bytes_contents.extend([b"a", b""])
    request.inputs.add(name="E", datatype="FP32", shape=[0])  # no values for none
    request.parameters["sequence_id"].string_param = "s1"
    request.parameters["priority"].uint64_param = 3
    request.outputs.add(name="OUT").parameters["classification"].int64_param = 2
    inputs = grpc_tensors.infer_request(request)
    assert [(t.name, t.shape) for t in inputs.inputs] == [("T", (2, 1)), ("E", (0,))]

"""The gRPC front's bounds on `ModelInferRequest`s in front of a real Triton (issue 26,
item 1, over gRPC), with the toy models `plain` (max_batch_size 0, INPUT0 dims [-1]) and
`batched` (max_batch_size 4, INPUT0 dims [2, 3], LABEL strings) from
tests/data/gateway_models: the crashing shape ([1000000, 1000000] FP32 with 4 bytes) is the
gateway's own INVALID_ARGUMENT naming the input, 20 times over, while the other model
answers its largest legal request over gRPC throughout and Triton's process stays the
same one; a batch past `max_batch_size` is the gateway's refusal too, and `ServerMetadata`
leaves out the extensions Triton lists that the front refuses."""

from __future__ import annotations

import asyncio
import struct
from pathlib import Path

import grpc
import numpy as np
import pytest
from tritonclient.grpc import service_pb2, service_pb2_grpc

from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton

NS = (("modelswap-namespace", "team-a"),)
PLAIN = route("plain", "team-a")
BATCHED = route("batched", "team-a")
#: batched's largest legal request: max_batch_size (4) rows of [2, 3], 4 x 3 strings
VALUES = [float(v) - 11.5 for v in range(24)]
LABELS = [s.encode() for s in ["a", "é", "\u2603"] * 4]


def crasher() -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="plain")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1_000_000, 1_000_000])
    request.raw_input_contents.append(b"\0\0\0\0")
    return request


def largest(batch: int = 4) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name="batched")
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[batch, 2, 3])
    request.inputs.add(name="LABEL", datatype="BYTES", shape=[batch, 3])
    rows = (VALUES * batch)[: batch * 6]
    request.raw_input_contents.append(struct.pack(f"<{len(rows)}f", *rows))
    labels = (LABELS * batch)[: batch * 3]
    request.raw_input_contents.append(b"".join(struct.pack("<I", len(s)) + s for s in labels))
    return request


def assert_largest(response: service_pb2.ModelInferResponse) -> None:
    outputs = {o.name: i for i, o in enumerate(response.outputs)}
    doubled = np.frombuffer(response.raw_output_contents[outputs["OUTPUT0"]], dtype=np.float32)
    assert doubled.tolist() == [2 * v for v in VALUES]
    assert list(response.outputs[outputs["LABEL_OUT"]].shape) == [4, 3]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_the_crashing_shape_20_times_over_grpc_is_refused_and_triton_stays_up(
    tmp_path: Path,
) -> None:
    served = [Served(PLAIN, "plain"), Served(BATCHED, "batched")]
    async with gateway_over_triton(tmp_path, served) as g:
        front = GrpcFront(
            g.served.gateway,
            GrpcSettings(
                upstream_target=f"127.0.0.1:{g.triton.process.ports.grpc}",
                host="127.0.0.1",
                port=0,
            ),
        )
        port = await front.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                pid = g.triton.process.pid
                assert_largest(await stub.ModelInfer(largest(), metadata=NS, timeout=60))
                answered = 0
                stop = asyncio.Event()

                async def the_other_model_answers() -> None:
                    nonlocal answered
                    while not stop.is_set():
                        assert_largest(await stub.ModelInfer(largest(), metadata=NS, timeout=30))
                        answered += 1

                probe = asyncio.create_task(the_other_model_answers())
                for _ in range(20):
                    with pytest.raises(grpc.aio.AioRpcError) as caught:
                        await stub.ModelInfer(crasher(), metadata=NS, timeout=30)
                    e = caught.value
                    assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
                    # the gateway's refusal, not Triton's
                    assert dict(e.trailing_metadata() or ())["modelswap-reason"] == "BadRequest"
                    assert (e.details() or "").startswith(
                        "input 'INPUT0': shape [1000000, 1000000] of FP32 is 4000000000000 bytes"
                    )
                stop.set()
                await asyncio.wait_for(probe, 30)
                assert answered > 0, "the other model answered while the crasher was refused"

                with pytest.raises(grpc.aio.AioRpcError) as past:
                    await stub.ModelInfer(largest(batch=5), metadata=NS, timeout=30)
                assert past.value.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert (past.value.details() or "").startswith(
                    "input 'INPUT0': shape [5, 2, 3] has a batch of 5; batched takes at most 4"
                )
                # Triton lists its full set; the front only what it serves
                meta = await stub.ServerMetadata(service_pb2.ServerMetadataRequest(), timeout=30)
                assert "classification" in meta.extensions and "statistics" in meta.extensions
                assert not {"system_shared_memory", "model_repository", "generate"} & set(
                    meta.extensions
                )
                # the same Triton, still serving plain
                assert g.triton.process.returncode() is None and g.triton.process.pid == pid
                ok = service_pb2.ModelInferRequest(model_name="plain")
                ok.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
                ok.raw_input_contents.append(struct.pack("<2f", 1, 2))
                answer = await stub.ModelInfer(ok, metadata=NS, timeout=30)
                assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [2, 4]
        finally:
            await front.stop()
        labels = {"uid": PLAIN.uid, "namespace": "team-a", "model": "plain", "code": "400"}
        assert g.served.metric("modelswap_gateway_requests_total", **labels) == 20

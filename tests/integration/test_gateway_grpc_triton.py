"""The gateway's gRPC front in front of a real Triton (CPU, from `make setup`), driven by the
official clients (`tritonclient.grpc`, sync and asyncio, unary and streaming): a swapped-out
model's burst waits for one swap-in, refusals carry retry information, names resolve as
documented (docs/GATEWAY.md, "gRPC").

A model's "swap-in" here is its real load into Triton (held until the test releases it),
so an answer that is right proves the gateway waited for it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as grpcaio
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.grpc_server import GrpcFront, GrpcSettings
from tests.support.gateway_fakes import route
from tests.support.gateway_triton import GatewayOverTriton, Served, gateway_over_triton
from tests.support.waiting import until, until_on_loop

NS = [("modelswap-namespace", "team-a")]


@dataclass
class GrpcWorld:
    g: GatewayOverTriton
    front: GrpcFront
    url: str

    def metric(self, name: str, **labels: str) -> float:
        return self.g.served.metric(name, **labels)


@contextlib.asynccontextmanager
async def grpc_world(
    tmp_path: Path, models: list[Served], **settings: Any
) -> AsyncIterator[GrpcWorld]:
    """`gateway_over_triton` with the gRPC front over the same gateway (shared queues,
    directory and metrics), forwarding to that Triton's gRPC port."""
    async with gateway_over_triton(tmp_path, models, **settings) as g:
        triton_grpc = f"127.0.0.1:{g.triton.process.ports.grpc}"
        front = GrpcFront(
            g.served.gateway, GrpcSettings(upstream_target=triton_grpc, host="127.0.0.1", port=0)
        )
        port = await front.start()
        try:
            yield GrpcWorld(g, front, f"127.0.0.1:{port}")
        finally:
            await front.stop()


def plain_inputs(i: int) -> list[grpcclient.InferInput]:
    data = np.array([i, i + 0.5], dtype=np.float32)
    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(data)
    return [tensor]


def assert_plain(result: Any, i: int, plain: ModelRoute) -> None:
    response = result.get_response()
    assert response.model_name == plain.name
    assert result.as_numpy("OUTPUT0").tolist() == [2 * i, 2 * i + 1]
    (uid,) = result.as_numpy("UID").reshape(-1)
    assert (uid.decode() if isinstance(uid, bytes) else uid) == plain.uid


def labels(r: ModelRoute) -> dict[str, str]:
    return {"uid": r.uid, "namespace": r.namespace, "model": r.name}


async def raw_call(
    url: str, method: str, request: Any, metadata: list[tuple[str, str]] = NS
) -> grpc.aio.AioRpcError:
    """The error a raw stub's call gets (trailing metadata included)."""
    async with grpc.aio.insecure_channel(url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await getattr(stub, method)(request, metadata=metadata)
        return caught.value


def plain_request(model: str, i: int = 1) -> service_pb2.ModelInferRequest:
    request = service_pb2.ModelInferRequest(model_name=model)
    tensor = request.inputs.add(name="INPUT0", datatype="FP32", shape=[2])
    del tensor
    request.raw_input_contents.append(np.array([i, i + 0.5], dtype=np.float32).tobytes())
    return request


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_aio_burst_of_100_at_a_swapped_out_model_one_swap_in_all_right(
    tmp_path: Path,
) -> None:
    plain = route("plain", "team-a", max_queued=256)
    async with grpc_world(tmp_path, [Served(plain, "plain")]) as w:
        w.g.directory.hold(plain.uid)
        client = grpcaio.InferenceServerClient(w.url)
        try:
            tasks = [
                asyncio.create_task(
                    client.infer("team-a/plain", plain_inputs(i), request_id=str(i))
                )
                for i in range(100)
            ]
            await until(lambda: w.g.served.gateway.queues.depth(plain.uid) == 100, "100 queued", 60)
            assert w.g.directory.in_flight[plain.uid] == 100  # queued requests count in flight
            w.g.directory.release(plain.uid)  # now the real load into Triton
            results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        finally:
            await client.close()
        for i, result in enumerate(results):
            assert_plain(result, i, plain)
            assert result.get_response().id == str(i)
        assert w.g.directory.swap_ins[plain.uid] == 1 and w.g.directory.completed[plain.uid] == 1
        assert w.metric("modelswap_gateway_swap_ins_triggered_total", **labels(plain)) == 1
        assert w.metric("modelswap_gateway_requests_total", **labels(plain), code="200") == 100
        assert w.g.directory.in_flight[plain.uid] == 0
        assert w.g.served.gateway.queues.depths() == []
        assert w.g.served.gateway.metrics.in_flight_requests == 0


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_sync_client_documents_readiness_and_refused_calls(tmp_path: Path) -> None:
    plain = route("plain", "team-a")
    async with grpc_world(tmp_path, [Served(plain, "plain")]) as w:

        def sync_calls() -> dict[str, Any]:
            client = grpcclient.InferenceServerClient(w.url)
            out: dict[str, Any] = {}
            try:
                out["live"] = client.is_server_live()
                out["ready"] = client.is_server_ready()
                out["model_ready_cold"] = client.is_model_ready("plain", headers=dict(NS))
                with pytest.raises(InferenceServerException) as cold:
                    client.get_model_metadata("plain", headers=dict(NS))
                out["metadata_cold"] = cold.value
                out["result"] = client.infer("plain", plain_inputs(3), headers=dict(NS))
                out["metadata"] = client.get_model_metadata("plain", headers=dict(NS))
                out["config"] = client.get_model_config("plain", headers=dict(NS)).config
                out["stats"] = client.get_inference_statistics("plain", headers=dict(NS))
                out["every_stats"] = client.get_inference_statistics(headers=dict(NS))
                out["server"] = client.get_server_metadata()
                with pytest.raises(InferenceServerException) as index:
                    client.get_model_repository_index()
                out["index"] = index.value
                with pytest.raises(InferenceServerException) as load:
                    client.load_model("plain")
                out["load"] = load.value
                with pytest.raises(InferenceServerException) as shm:
                    client.get_system_shared_memory_status()
                out["shm"] = shm.value
            finally:
                client.close()
            return out

        out = await asyncio.to_thread(sync_calls)
        assert out["live"] and out["ready"]
        assert out["model_ready_cold"]  # swapped out: it serves on request
        assert out["metadata_cold"].status() == "StatusCode.UNAVAILABLE"
        assert "swapped out" in out["metadata_cold"].message()
        assert_plain(out["result"], 3, plain)
        assert out["metadata"].name == "plain"
        assert [i.name for i in out["metadata"].inputs] == ["INPUT0"]
        assert out["config"].name == "plain"
        assert not [k for k in out["config"].parameters if k.startswith("modelswap.")]
        assert [s.name for s in out["stats"].model_stats] == ["plain"]
        assert out["stats"].model_stats[0].inference_count == 1
        assert [s.name for s in out["every_stats"].model_stats] == ["team-a/plain"]
        assert out["server"].name == "triton"
        for refused in ("index", "load", "shm"):
            assert out[refused].status() == "StatusCode.UNIMPLEMENTED", out[refused]
        assert "repository API is not exposed" in out["load"].message()
        assert w.g.directory.swap_ins[plain.uid] == 1  # documents and readiness never woke it
        # the trailing metadata of a refusal that asks to retry
        w.g.directory.swap_out(plain.uid)
        await w.g.triton.driver.unload(plain.uid)
        e = await raw_call(w.url, "ModelMetadata", service_pb2.ModelMetadataRequest(name="plain"))
        trailing = dict(e.trailing_metadata() or ())
        assert e.code() == grpc.StatusCode.UNAVAILABLE
        assert trailing["modelswap-reason"] == "ModelSwappedOut" and trailing["retry-after"] == "1"


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_full_queue_and_queue_timeout_are_refused_with_retry_information(
    tmp_path: Path,
) -> None:
    plain = route("plain", "team-a", max_queued=1, queue_timeout_seconds=1.0)
    async with grpc_world(tmp_path, [Served(plain, "plain")], retry_after_seconds=3) as w:
        w.g.directory.hold(plain.uid)
        first = asyncio.create_task(raw_call(w.url, "ModelInfer", plain_request("plain")))
        await until(lambda: w.g.served.gateway.queues.depth(plain.uid) == 1, "one queued", 30)
        full = await raw_call(w.url, "ModelInfer", plain_request("plain"))
        assert full.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, full
        trailing = dict(full.trailing_metadata() or ())
        assert trailing["modelswap-reason"] == "QueueFull"
        assert trailing["retry-after"] == "3" and trailing["grpc-retry-pushback-ms"] == "3000"
        timed_out = await asyncio.wait_for(first, 30)
        assert timed_out.code() == grpc.StatusCode.UNAVAILABLE, timed_out
        trailing = dict(timed_out.trailing_metadata() or ())
        assert trailing["modelswap-reason"] == "QueueTimeout" and trailing["retry-after"] == "3"
        # a refusal's status can reach the client before its handler has counted it
        await until_on_loop(lambda: w.g.directory.in_flight[plain.uid] == 0, "both finished")
        await until_on_loop(
            lambda: w.metric("modelswap_gateway_requests_total", **labels(plain), code="503") == 1,
            "the timeout counted",
        )
        assert w.metric("modelswap_gateway_requests_total", **labels(plain), code="429") == 1
        assert (
            w.metric("modelswap_gateway_refusals_total", **labels(plain), reason="QueueFull") == 1
        )
        w.g.directory.release(plain.uid)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_names_namespace_from_the_name_or_metadata_and_ambiguity(tmp_path: Path) -> None:
    a = route("plain", "team-a")
    b = route("plain", "team-b")
    models = [Served(a, "plain"), Served(b, "plain")]
    async with grpc_world(tmp_path, models, local_mode=True) as w:
        ambiguous = await raw_call(w.url, "ModelInfer", plain_request("plain"), metadata=[])
        assert ambiguous.code() == grpc.StatusCode.FAILED_PRECONDITION, ambiguous
        assert dict(ambiguous.trailing_metadata() or ())["modelswap-reason"] == "AmbiguousModel"
        assert "team-a/plain, team-b/plain" in (ambiguous.details() or "")
        assert "modelswap-namespace" in (ambiguous.details() or "")
        client = grpcaio.InferenceServerClient(w.url)
        try:
            by_name = await client.infer("team-b/plain", plain_inputs(1))
            by_metadata = await client.infer(
                "plain", plain_inputs(2), headers={"modelswap-namespace": "team-a"}
            )
            with pytest.raises(InferenceServerException) as clash:
                await client.infer(
                    "team-b/plain", plain_inputs(1), headers={"modelswap-namespace": "team-a"}
                )
            with pytest.raises(InferenceServerException) as unknown:
                await client.infer("team-c/plain", plain_inputs(1))
        finally:
            await client.close()
        assert_plain(by_name, 1, b)
        assert_plain(by_metadata, 2, a)
        assert clash.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert unknown.value.status() == "StatusCode.NOT_FOUND"
    # outside local mode a bare name without a namespace is refused
    async with grpc_world(tmp_path / "cluster", [Served(a, "plain")]) as w:
        bare = await raw_call(w.url, "ModelInfer", plain_request("plain"), metadata=[])
        assert bare.code() == grpc.StatusCode.INVALID_ARGUMENT, bare
        assert dict(bare.trailing_metadata() or ())["modelswap-reason"] == "NamespaceRequired"
        assert w.g.directory.swap_ins[a.uid] == 0


def token_inputs(text: str) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("text_input", [1], "BYTES")
    tensor.set_data_from_numpy(np.array([text.encode()], dtype=np.object_))
    return [tensor]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_stream_to_a_swapped_out_decoupled_model(tmp_path: Path) -> None:
    tokens = route("tokens", "team-a", decoupled=True)
    async with grpc_world(tmp_path, [Served(tokens, "tokens")]) as w:
        prompts = {"0": "hello world", "1": "one two three", "2": "x"}

        async def requests() -> AsyncIterator[dict[str, Any]]:
            for request_id, text in prompts.items():
                yield {
                    "model_name": "tokens",
                    "inputs": token_inputs(text),
                    "request_id": request_id,
                }
            # refused inside the stream, which goes on
            yield {"model_name": "nope", "inputs": token_inputs("a"), "request_id": "bad"}

        client = grpcaio.InferenceServerClient(w.url)
        got: dict[str, list[str]] = {}
        errors: list[str] = []
        try:
            async for result, error in client.stream_infer(requests(), headers=dict(NS)):
                if error is not None:
                    errors.append(str(error))
                    continue
                response = result.get_response()
                assert response.model_name == "tokens"
                (token,) = result.as_numpy("text_output").reshape(-1)
                got.setdefault(response.id, []).append(token.decode())
            with pytest.raises(InferenceServerException) as unary:
                await client.infer("tokens", token_inputs("a"), headers=dict(NS))
        finally:
            await client.close()
        expected = {i: [" " + word.upper() for word in text.split()] for i, text in prompts.items()}
        assert got == expected
        assert len(errors) == 1 and "ModelNotFound" in errors[0], errors
        assert unary.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert "ModelStreamInfer" in unary.value.message()
        assert w.g.directory.swap_ins[tokens.uid] == 1
        assert w.metric("modelswap_gateway_requests_total", **labels(tokens), code="200") == 3
        await until_on_loop(lambda: w.g.directory.in_flight[tokens.uid] == 0, "stream closed")
        # the refused unary call's status can reach the client before its handler ends
        await until_on_loop(
            lambda: w.g.served.gateway.metrics.in_flight_requests == 0, "nothing in flight"
        )


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_a_drain_past_its_deadline_ends_a_grpc_stream_with_retry_information(
    tmp_path: Path,
) -> None:
    pace = tmp_path / "pace"
    pace.mkdir()
    tokens = route("tokens", "team-a", decoupled=True)
    async with grpc_world(tmp_path, [Served(tokens, "tokens", {"pace_dir": str(pace)})]) as w:
        async with grpc.aio.insecure_channel(w.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            request = service_pb2.ModelInferRequest(model_name="team-a/tokens", id="r")
            request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            text = b"held here"
            request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
            call = stub.ModelStreamInfer(iter([request]))
            first = await call.read()  # token 0; the model now waits for go-1
            assert first.infer_response.model_name == "tokens"
            assert w.g.served.gateway.at_triton.count(tokens.triton_name) == 1
            ended = w.g.served.app.end_requests(tokens.triton_name, "the swap-out's drain ended")
            assert ended == 1
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                while await call.read() is not grpc.aio.EOF:
                    pass
            (pace / "go-1").touch()  # let the model's thread finish
        e = caught.value
        trailing = dict(e.trailing_metadata() or ())
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert trailing["modelswap-reason"] == "DrainDeadline" and "retry-after" in trailing
        await until(lambda: w.g.directory.in_flight[tokens.uid] == 0, "stream finished", 10)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_a_shape_far_larger_than_its_data_is_refused_and_triton_still_serves(
    tmp_path: Path,
) -> None:
    """The HTTP front bounds a request's shapes before forwarding because Triton's HTTP
    frontend allocated from `shape` (4 TB, then aborted); its gRPC frontend compares each raw
    input's bytes with its shape first, which this holds it to."""
    plain = route("plain", "team-a")
    async with grpc_world(tmp_path, [Served(plain, "plain")]) as w:
        client = grpcaio.InferenceServerClient(w.url)
        try:
            assert_plain(await client.infer("team-a/plain", plain_inputs(1)), 1, plain)
            huge = service_pb2.ModelInferRequest(model_name="team-a/plain")
            huge.inputs.add(name="INPUT0", datatype="FP32", shape=[1_000_000, 1_000_000])
            huge.raw_input_contents.append(b"\0\0\0\0")
            refused = await raw_call(w.url, "ModelInfer", huge, metadata=[])
            assert refused.code() == grpc.StatusCode.INVALID_ARGUMENT, refused
            assert plain.triton_name not in (refused.details() or "")  # the user's name only
            # the same Triton (nothing restarts it here) answers the next request
            assert_plain(await client.infer("team-a/plain", plain_inputs(2)), 2, plain)
        finally:
            await client.close()


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_http_and_grpc_bursts_at_one_swapped_out_model_share_one_swap_in(
    tmp_path: Path,
) -> None:
    plain = route("plain", "team-a", max_queued=256)
    async with (
        grpc_world(tmp_path, [Served(plain, "plain")]) as w,
        aiohttp.ClientSession() as http,
    ):
        w.g.directory.hold(plain.uid)
        client = grpcaio.InferenceServerClient(w.url)
        url = f"{w.g.served.url}/ns/team-a/v2/models/plain/infer"

        async def over_http(i: int) -> Any:
            body = {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                                "data": [i, i + 0.5]}]}  # fmt: skip
            async with http.post(url, json=body) as r:
                assert r.status == 200, await r.text()
                return await r.json()

        try:
            grpc_calls = [
                asyncio.create_task(client.infer("team-a/plain", plain_inputs(i)))
                for i in range(50)
            ]
            http_calls = [asyncio.create_task(over_http(i)) for i in range(50)]
            await until(lambda: w.g.served.gateway.queues.depth(plain.uid) == 100, "100 queued")
            w.g.directory.release(plain.uid)
            grpc_results = await asyncio.wait_for(asyncio.gather(*grpc_calls), 60)
            http_results = await asyncio.wait_for(asyncio.gather(*http_calls), 60)
        finally:
            await client.close()
        for i, result in enumerate(grpc_results):
            assert_plain(result, i, plain)
        for i, body in enumerate(http_results):
            outputs = {o["name"]: o["data"] for o in body["outputs"]}
            assert body["model_name"] == "plain" and outputs["OUTPUT0"] == [2 * i, 2 * i + 1]
        assert w.g.directory.swap_ins[plain.uid] == 1
        assert w.metric("modelswap_gateway_swap_ins_triggered_total", **labels(plain)) == 1
        assert w.metric("modelswap_gateway_requests_total", **labels(plain), code="200") == 100


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_triton_dying_under_a_stream_ends_it_though_the_client_sends_nothing_more(
    tmp_path: Path,
) -> None:
    pace = tmp_path / "pace"
    pace.mkdir()
    tokens = route("tokens", "team-a", decoupled=True)
    async with grpc_world(tmp_path, [Served(tokens, "tokens", {"pace_dir": str(pace)})]) as w:
        more = asyncio.Event()  # never set: the client keeps its side of the stream open

        async def requests() -> AsyncIterator[service_pb2.ModelInferRequest]:
            request = service_pb2.ModelInferRequest(model_name="team-a/tokens", id="r")
            request.inputs.add(name="text_input", datatype="BYTES", shape=[1])
            text = b"held here"
            request.raw_input_contents.append(len(text).to_bytes(4, "little") + text)
            yield request
            await more.wait()

        async with grpc.aio.insecure_channel(w.url) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            call = stub.ModelStreamInfer(requests())
            first = await call.read()  # token 0; the model now waits for go-1
            assert first.infer_response.model_name == "tokens"
            await w.g.triton.process.kill()
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await asyncio.wait_for(call.read(), 30)
        e = caught.value
        trailing = dict(e.trailing_metadata() or ())
        assert e.code() == grpc.StatusCode.UNAVAILABLE, e
        assert trailing["modelswap-reason"] == "UpstreamUnavailable", trailing
        assert "retry-after" in trailing
        await until(lambda: w.g.directory.in_flight[tokens.uid] == 0, "stream finished", 10)

"""The gateway's KServe v2 routes over HTTP on loopback, with a fake Triton behind them:
name mapping (Host header, /ns/ prefix, bare names), renaming, swap-in on request, errors
and metrics."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_fakes import FakeDirectory, route, served_gateway
from tests.support.gateway_world import GatewayWorld, gateway_world
from tests.support.waiting import until_on_loop

LLAMA_A = route("llama", "team-a")
LLAMA_B = route("llama", "team-b")
BERT = route("bert", "team-a")
CHAT = route("chat", "team-a", decoupled=True)
ALL = (LLAMA_A, LLAMA_B, BERT, CHAT)


def infer_body(values: list[float]) -> dict[str, Any]:
    return {
        "inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]
    }


class World(GatewayWorld):
    async def post(self, path: str, body: Any, **headers: str) -> tuple[int, Any, dict[str, str]]:
        async with self.http.post(self.served.url + path, json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)

    async def get(self, path: str, **headers: str) -> tuple[int, bytes, dict[str, str]]:
        async with self.http.get(self.served.url + path, headers=headers) as r:
            return r.status, await r.read(), dict(r.headers)


def world(*, resident: bool = True, **settings: Any) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, ALL, resident=resident, **settings)


@pytest.mark.asyncio
async def test_the_service_host_picks_the_namespace_and_triton_sees_its_own_name() -> None:
    async with world() as w:
        status, body, _ = await w.post(
            "/v2/models/llama/infer", infer_body([1, 2]), Host="llama.team-b.svc.cluster.local:80"
        )
        assert status == 200
        assert body["model_name"] == "llama" and body["outputs"][0]["data"] == [2, 4]
        assert w.triton.calls[-1][0] == f"/v2/models/{LLAMA_B.triton_name}/infer"
        assert w.directory.requests[-1][0] == LLAMA_B.uid


@pytest.mark.asyncio
async def test_a_request_is_recorded_at_its_receipt_and_again_at_its_answer() -> None:
    async with world() as w:
        status, _, headers = await w.post("/ns/team-a/v2/models/bert/infer", infer_body([1]))
        assert status == 200
        (uid, received), (again, answered) = w.directory.requests
        assert uid == again == BERT.uid
        assert 0 <= received - float(headers["X-Modelswap-Received-At"]) < 0.1
        assert answered >= received  # the idle clock starts from the answer


@pytest.mark.asyncio
async def test_the_ns_prefix_picks_the_namespace() -> None:
    async with world() as w:
        status, body, _ = await w.post(
            "/ns/team-a/v2/models/llama/versions/1/infer", infer_body([3])
        )
        assert status == 200 and body["outputs"][0]["data"] == [6]
        assert w.triton.calls[-1][0] == f"/v2/models/{LLAMA_A.triton_name}/versions/1/infer"


@pytest.mark.asyncio
async def test_names_without_a_namespace() -> None:
    async with world() as w:  # cluster mode: a namespace is required
        status, body, _ = await w.post("/v2/models/bert/infer", infer_body([1]))
        assert status == 400 and body["reason"] == "NamespaceRequired"
    async with world(local_mode=True) as w:
        status, body, _ = await w.post("/v2/models/bert/infer", infer_body([1]))
        assert status == 200 and body["model_name"] == "bert"
        status, body, _ = await w.post("/v2/models/llama/infer", infer_body([1]))
        assert status == 409 and body["reason"] == "AmbiguousModel"
        assert body["candidates"] == ["team-a/llama", "team-b/llama"]
        assert "/ns/<namespace>/" in body["error"]
        status, body, _ = await w.post("/v2/models/gpt/infer", infer_body([1]))
        assert status == 404 and body["reason"] == "ModelNotFound"
        status, body, _ = await w.post("/ns/team-b/v2/models/bert/infer", infer_body([1]))
        assert status == 404
        assert (
            body["error"]
            == "model 'bert' not found in namespace 'team-b' (namespace from the path prefix /ns/team-b/)"
        )
        assert not w.directory.swap_ins and all(
            c[0].endswith(("/infer", "/config")) for c in w.triton.calls
        )


@pytest.mark.asyncio
async def test_metadata_ready_and_health() -> None:
    async with world() as w:
        status, raw, _ = await w.get("/ns/team-a/v2/models/llama")
        assert status == 200 and json.loads(raw)["name"] == "llama"
        status, _, headers = await w.get("/ns/team-a/v2/models/llama/ready")
        assert status == 200 and headers["X-Modelswap-State"] == "RESIDENT"
        assert (await w.get("/v2/health/ready"))[0] == 200
        assert (await w.get("/v2/health/live"))[0] == 200
        assert json.loads((await w.get("/v2"))[1])["name"] == "triton"
        w.triton.ready = False
        status, raw, _ = await w.get("/v2/health/ready")
        assert status == 503 and json.loads(raw)["reason"] == "TritonNotReady"
        # Nothing of this counts as use.
        assert w.directory.requests == []


@pytest.mark.asyncio
async def test_probes_do_not_wake_a_swapped_out_model() -> None:
    async with world(resident=False) as w:
        status, _, headers = await w.get("/ns/team-a/v2/models/llama/ready")
        assert status == 200 and headers["X-Modelswap-State"] == "SWAPPED_OUT"
        status, raw, headers = await w.get("/ns/team-a/v2/models/llama")
        assert status == 503 and "swapped out" in json.loads(raw)["error"]
        assert headers["Retry-After"] == "1"
        assert not w.directory.swap_ins and w.directory.requests == []


@pytest.mark.asyncio
async def test_a_request_for_a_swapped_out_model_swaps_it_in_once() -> None:
    async with world(resident=False) as w:
        w.directory.hold(BERT.uid)

        async def one(i: int) -> tuple[int, Any, dict[str, str]]:
            return await w.post("/ns/team-a/v2/models/bert/infer", infer_body([i]))

        sent_from = time.time()
        tasks = [asyncio.create_task(one(i)) for i in range(30)]
        await until_on_loop(lambda: w.served.gateway.queues.depth(BERT.uid) == 30, "30 queued")
        labels = {"uid": BERT.uid, "namespace": "team-a", "model": "bert"}
        assert w.served.metric("modelswap_gateway_queue_depth_requests", **labels) == 30
        released_at = time.time()
        w.directory.release(BERT.uid)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 20)
        assert [body["outputs"][0]["data"] for _, body, _ in results] == [
            [2 * i] for i in range(30)
        ]
        assert all(float(h["X-Modelswap-Queue-Wait-Seconds"]) >= 0 for _, _, h in results)
        # each was received before the swap-in ended, and waited at least until then
        for _, _, h in results:
            received = float(h["X-Modelswap-Received-At"])
            assert sent_from <= received <= released_at
            assert received + float(h["X-Modelswap-Queue-Wait-Seconds"]) >= released_at - 0.002
        assert w.directory.swap_ins[BERT.uid] == 1
        assert w.served.metric("modelswap_gateway_swap_ins_triggered_total", **labels) == 1
        assert w.served.metric("modelswap_gateway_requests_total", **labels, code="200") == 30
        assert (
            w.served.metric(
                "modelswap_gateway_queue_wait_seconds_count", **labels, outcome="released"
            )
            == 30
        )
        assert w.served.metric("modelswap_gateway_queue_depth_requests", **labels) == 0
        assert w.served.metric("modelswap_gateway_in_flight_requests") == 0


@pytest.mark.asyncio
async def test_queue_full_timeout_and_failure_answers_carry_retry_after() -> None:
    async with world(resident=False) as w:
        small = route("small", "team-a", max_queued=1, queue_timeout_seconds=0.05)
        w.directory.table.replace([*ALL, small])
        w.directory.hold(small.uid)
        status, body, headers = await w.post("/ns/team-a/v2/models/small/infer", infer_body([1]))
        assert status == 503 and body["reason"] == "QueueTimeout" and headers["Retry-After"] == "1"
        w.directory.hold(BERT.uid)
        first = asyncio.create_task(w.post("/ns/team-a/v2/models/bert/infer", infer_body([1])))
        await until_on_loop(lambda: w.served.gateway.queues.depth(BERT.uid) == 1, "one queued")
        bert = route("bert", "team-a", uid=BERT.uid, max_queued=1)
        w.directory.table.replace([LLAMA_A, LLAMA_B, bert, CHAT, small])
        status, body, headers = await w.post("/ns/team-a/v2/models/bert/infer", infer_body([1]))
        assert status == 429 and body["reason"] == "QueueFull" and headers["Retry-After"] == "1"
        w.directory.failure[BERT.uid] = RuntimeError("no room")
        w.directory.release(BERT.uid)
        status, body, headers = await first
        assert status == 503 and body["reason"] == "SwapInFailed" and "no room" in body["error"]
        labels = {"uid": BERT.uid, "namespace": "team-a", "model": "bert"}
        for reason in ("QueueFull", "SwapInFailed"):
            assert w.served.metric("modelswap_gateway_refusals_total", **labels, reason=reason) == 1
        assert w.served.metric("modelswap_gateway_requests_total", **labels, code="429") == 1


@pytest.mark.asyncio
async def test_a_model_that_went_away_before_the_call_goes_round_again() -> None:
    async with world() as w:
        w.directory.swap_out(BERT.uid)
        w.triton.loaded.discard(BERT.triton_name)
        w.directory.stale_once(BERT.uid)  # admission still saw it resident
        status, body, _ = await w.post("/ns/team-a/v2/models/bert/infer", infer_body([5]))
        assert status == 200 and body["outputs"][0]["data"] == [10]
        assert w.directory.swap_ins[BERT.uid] == 1


@pytest.mark.asyncio
async def test_triton_errors_are_relayed_under_the_users_name() -> None:
    async with world() as w:
        w.triton.loaded.discard(BERT.triton_name)  # Triton lost it while the agent thinks resident
        status, body, _ = await w.post("/ns/team-a/v2/models/bert/infer", infer_body([1]))
        assert status == 404 and body == {"error": "Request for unknown model: 'bert' is not found"}
        status, body, _ = await w.post("/ns/team-a/v2/models/chat/infer", infer_body([1]))
        assert status == 400 and "generate_stream" in body["error"]
        async with w.http.post(w.served.url + "/ns/team-a/v2/models/llama/infer", data=b"{") as r:
            assert r.status == 400  # Triton's own answer to a broken body... from the fake
        assert (await w.get("/nope"))[0] == 404


@pytest.mark.asyncio
async def test_generate_stream_passes_events_through_renamed() -> None:
    async with world() as w:
        async with w.http.post(
            w.served.url + "/ns/team-a/v2/models/chat/generate_stream", json={"text_input": "a b"}
        ) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            text = await r.text()
        events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
        assert [e["text_output"] for e in events] == [" A", " B"]
        assert {e["model_name"] for e in events} == {"chat"}
        async with w.http.post(
            w.served.url + "/ns/team-a/v2/models/chat/generate_stream", json={"nothing": 1}
        ) as r:
            assert r.status == 400 and await r.json() == {
                "error": "missing text_input for model 'chat'"
            }


@pytest.mark.asyncio
async def test_an_unreachable_triton_is_a_503_to_send_again() -> None:
    """Triton down (it died, the supervisor restarts it): 503 with Retry-After, so clients
    send again, as they do for every other refusal; not a 502 they would give up on."""
    from modelswap_sidecar.triton.process import free_loopback_port

    directory = FakeDirectory(ALL, resident=[r.uid for r in ALL])
    closed = f"127.0.0.1:{free_loopback_port()}"  # nothing listens there
    async with (
        served_gateway(directory, closed, upstream_connect_timeout_seconds=5) as served,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            served.url + "/ns/team-a/v2/models/bert/infer", json=infer_body([1])
        ) as r:
            body = await r.json()
        assert r.status == 503 and body["reason"] == "UpstreamUnavailable"
        assert r.headers["Retry-After"] == "1"
        assert body["error"].startswith("Triton did not answer")
        async with http.post(
            served.url + "/ns/team-a/v1/completions", json={"model": "chat", "prompt": "x"}
        ) as r:
            assert r.status == 503 and (await r.json())["error"]["code"] == "UpstreamUnavailable"
            assert r.headers["Retry-After"] == "1"


@pytest.mark.asyncio
async def test_a_triton_that_dies_mid_answer_is_a_503_to_send_again() -> None:
    """Triton killed while it answers: the headers and part of the body came, then the
    connection closed. The client gets 503 UpstreamUnavailable with Retry-After."""

    async def dying(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 1000\r\n\r\n{\"model_name\"")  # fmt: skip
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(dying, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    directory = FakeDirectory(ALL, resident=[r.uid for r in ALL])
    async with (
        server,
        served_gateway(directory, f"127.0.0.1:{port}") as served,
        aiohttp.ClientSession() as http,
    ):
        async with http.post(
            served.url + "/ns/team-a/v2/models/bert/infer", json=infer_body([1])
        ) as r:
            body = await r.json()
        assert r.status == 503 and body["reason"] == "UpstreamUnavailable", body
        assert r.headers["Retry-After"] == "1"
        assert body["error"].startswith("Triton's answer broke off")


@pytest.mark.asyncio
async def test_a_gzip_body_is_answered_as_a_plain_one() -> None:
    """Issue 12, finding 8: a gzip-encoded infer (tritonclient's request compression) was
    decoded by the gateway but forwarded still marked gzip, and answered with empty outputs."""
    import gzip

    async with world() as w:
        body = gzip.compress(json.dumps(infer_body([1, 2, 3])).encode())
        headers = {"Host": "llama.team-a.svc", "Content-Encoding": "gzip",
                   "Content-Type": "application/json"}  # fmt: skip
        async with w.http.post(w.served.url + "/v2/models/llama/infer", data=body,
                               headers=headers) as r:  # fmt: skip
            answer = await r.json(content_type=None)
            assert r.status == 200, answer
        assert answer["outputs"][0]["data"] == [2, 4, 6]
        assert w.triton.encodings[-1] is None


@pytest.mark.asyncio
async def test_config_and_stats_answer_under_the_users_name_without_agent_parameters() -> None:
    """Issue 12, finding 8: tritonclient's get_model_config and get_inference_statistics
    answered 404 through the gateway."""
    async with world() as w:
        status, raw, _ = await w.get("/v2/models/llama/config", Host="llama.team-a.svc")
        config = json.loads(raw)
        assert status == 200 and config["name"] == "llama"
        assert config["parameters"] == {"user_knob": {"string_value": "7"}}
        status, raw, _ = await w.get("/ns/team-a/v2/models/llama/stats")
        stats = json.loads(raw)
        assert status == 200 and stats["model_stats"][0]["name"] == "llama"
        assert LLAMA_A.triton_name not in raw.decode()
        assert w.directory.swap_ins[LLAMA_A.uid] == 0  # reading them wakes nothing


@pytest.mark.asyncio
async def test_a_thousand_clients_connecting_while_the_gateway_is_busy_all_get_in() -> None:
    """The listen backlog holds a burst: while the event loop is busy (it accepts nothing),
    a thousand connects all complete. With aiohttp's backlog of 128 the kernel dropped the
    handshakes past it, and on a loaded node reset some (issue 12, the load suite)."""
    directory = FakeDirectory(ALL, resident=[r.uid for r in ALL])
    async with served_gateway(directory, "127.0.0.1:1") as served:
        port = int(served.url.rsplit(":", 1)[1])
        connected: list[socket.socket] = []
        try:
            for _ in range(1000):  # blocking, on the loop's own thread: nothing is accepted
                connected.append(socket.create_connection(("127.0.0.1", port), timeout=3))
        finally:
            for s in connected:
                s.close()
        assert len(connected) == 1000

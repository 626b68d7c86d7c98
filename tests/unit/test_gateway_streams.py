"""The gateway's OpenAI routes, progress streams and client disconnects over HTTP on
loopback, with a fake Triton whose token stream the test paces."""

from __future__ import annotations

import asyncio
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world
from tests.support.waiting import until_on_loop

CHAT_A = route("chat", "team-a", decoupled=True)
CHAT_B = route("chat", "team-b", decoupled=True)
BERT = route("bert", "team-a")
ALL = (CHAT_A, CHAT_B, BERT)
HOST_A = {"Host": "chat.team-a.svc.cluster.local"}


class World(GatewayWorld):
    def url(self, path: str) -> str:
        return self.served.url + path


def world(*, resident: bool = True, **settings: Any) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, ALL, resident=resident, **settings)


async def next_line(response: aiohttp.ClientResponse, prefix: str = "") -> str:
    """The next non-empty line of an event stream (that starts with `prefix`)."""
    while True:
        raw = await asyncio.wait_for(response.content.readline(), 10)
        assert raw, "the stream ended"
        line = raw.decode().rstrip("\n")
        if line and line.startswith(prefix):
            return line


async def raw_request(base_url: str, path: str, body: Any, progress: bool) -> asyncio.StreamWriter:
    """An HTTP request over a socket the test closes whenever it likes."""
    host, port = base_url.removeprefix("http://").split(":")
    _, writer = await asyncio.open_connection(host, int(port))
    payload = json.dumps(body).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
    if progress:
        head += "X-Modelswap-Progress: sse\r\n"
    writer.write(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
    await writer.drain()
    return writer


def data_of(line: str) -> Any:
    assert line.startswith("data: "), line
    return json.loads(line.removeprefix("data: "))


@pytest.mark.asyncio
async def test_models_are_listed_per_namespace_and_qualified_when_names_collide() -> None:
    async with world() as w:
        async with w.http.get(w.url("/v1/models"), headers=HOST_A) as r:
            listed = await r.json()
        assert [m["id"] for m in listed["data"]] == ["bert", "chat"]
        assert {m["owned_by"] for m in listed["data"]} == {"team-a"}
        async with w.http.get(w.url("/v1/models")) as r:
            assert r.status == 400 and (await r.json())["error"]["code"] == "NamespaceRequired"
    async with world(local_mode=True) as w:
        async with w.http.get(w.url("/v1/models")) as r:
            assert [m["id"] for m in (await r.json())["data"]] == [
                "bert",
                "team-a/chat",
                "team-b/chat",
            ]
        async with w.http.get(w.url("/v1/models/team-b/chat")) as r:
            assert (await r.json())["owned_by"] == "team-b"
        async with w.http.get(w.url("/v1/models/nope")) as r:
            assert r.status == 404 and (await r.json())["error"]["type"] == "invalid_request_error"


@pytest.mark.asyncio
async def test_a_non_streaming_completion_aggregates_the_stream() -> None:
    async with world(local_mode=True) as w:
        body = {"model": "team-b/chat", "prompt": "one two three", "max_tokens": 2}
        async with w.http.post(w.url("/v1/completions"), json=body) as r:
            answer = await r.json()
        assert r.status == 200
        assert answer["choices"][0]["text"] == " ONE TWO"
        assert answer["choices"][0]["finish_reason"] == "length"
        assert answer["object"] == "text_completion" and answer["model"] == "team-b/chat"
        assert w.triton.calls[-1][0] == f"/v2/models/{CHAT_B.triton_name}/generate_stream"
        chat = {"model": "chat", "messages": [{"role": "user", "content": "hi there"}]}
        async with w.http.post(w.url("/ns/team-a/v1/chat/completions"), json=chat) as r:
            answer = await r.json()
        # The fake answers with the prompt's words: the rendered chat prompt.
        assert answer["choices"][0]["message"] == {
            "role": "assistant",
            "content": " USER: HI THERE ASSISTANT:",
        }
        assert answer["choices"][0]["finish_reason"] == "stop"
        async with w.http.post(
            w.url("/v1/completions"), json={"model": "chat", "prompt": "x"}
        ) as r:
            assert r.status == 409 and (await r.json())["error"]["code"] == "AmbiguousModel"
        async with w.http.post(w.url("/v1/completions"), data=b"{") as r:
            assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
        bad = {"model": "team-a/chat", "prompt": "x"}
        async with w.http.post(w.url("/ns/team-b/v1/completions"), json=bad) as r:
            assert r.status == 400


@pytest.mark.asyncio
async def test_a_streaming_completion_arrives_chunk_by_chunk() -> None:
    async with world() as w:
        w.triton.paced = True  # token i >= 1 is generated only after allow(i)
        body = {"model": "chat", "prompt": "a b c d", "stream": True}
        async with w.http.post(w.url("/v1/completions"), json=body, headers=HOST_A) as r:
            assert r.headers["Content-Type"].startswith("text/event-stream")
            for index, word in enumerate("ABCD"):
                chunk = data_of(await next_line(r))
                assert chunk["choices"][0]["text"] == " " + word
                # This chunk reached the client before the next token was generated.
                assert w.triton.sent_tokens == index + 1
                w.triton.allow(index + 1)
            last = data_of(await next_line(r))
            assert last["choices"][0]["finish_reason"] == "stop"
            assert await next_line(r) == "data: [DONE]"
            assert (await r.content.read()).strip() == b""


@pytest.mark.asyncio
async def test_a_chat_stream_and_a_models_error_mid_stream() -> None:
    async with world() as w:
        body = {"model": "chat", "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with w.http.post(w.url("/v1/chat/completions"), json=body, headers=HOST_A) as r:
            first = data_of(await next_line(r))
            assert first["object"] == "chat.completion.chunk"
            assert first["choices"][0]["delta"] == {"role": "assistant", "content": " USER:"}
            text = await r.text()
        assert text.rstrip().endswith("data: [DONE]")
        broken = {"model": "chat", "prompt": "a FAIL b", "stream": True}
        async with w.http.post(w.url("/v1/completions"), json=broken, headers=HOST_A) as r:
            assert data_of(await next_line(r))["choices"][0]["text"] == " A"
            error = data_of(await next_line(r))
            assert error["error"]["message"] == "the model failed: the model broke"
            assert "[DONE]" not in await r.text()
        broken["stream"] = False
        async with w.http.post(w.url("/v1/completions"), json=broken, headers=HOST_A) as r:
            assert r.status == 500 and (await r.json())["error"]["type"] == "server_error"


@pytest.mark.asyncio
async def test_progress_lines_while_waiting_then_the_answer() -> None:
    async with world(resident=False, progress_interval_seconds=0.01) as w:
        w.directory.hold(BERT.uid)
        infer = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [4]}]}
        async with w.http.post(
            w.url("/ns/team-a/v2/models/bert/infer"),
            json=infer,
            headers={"X-Modelswap-Progress": "sse"},
        ) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            assert await next_line(r) == ": swap-in queued position=1"
            line = await next_line(r)
            assert line.startswith(": swap-in ALLOCATING waited=") and line.endswith("position=1")
            w.directory.release(BERT.uid)
            rest = (await r.text()).split("\n")
        # Then `: swap-in done`, and the answer as one data event, renamed.
        done = [i for i, line in enumerate(rest) if line.startswith(": swap-in done waited=")]
        data = [i for i, line in enumerate(rest) if line.startswith("data: ")]
        assert len(done) == 1 and len(data) == 1 and done[0] < data[0]
        answer = data_of(rest[data[0]])
        assert answer["model_name"] == "bert" and answer["outputs"][0]["data"] == [8]
        # A resident model: the same stream shape, without the waiting.
        async with w.http.post(
            w.url("/ns/team-a/v2/models/bert/infer"),
            json=infer,
            headers={"X-Modelswap-Progress": "sse"},
        ) as r:
            assert data_of(await next_line(r))["outputs"][0]["data"] == [8]


@pytest.mark.asyncio
async def test_progress_for_a_streaming_completion_and_for_a_queue_timeout() -> None:
    async with world(resident=False, progress_interval_seconds=0.01) as w:
        w.directory.hold(CHAT_A.uid)
        body = {"model": "chat", "prompt": "p q", "stream": True}
        headers = {**HOST_A, "Accept": "text/event-stream"}
        async with w.http.post(w.url("/v1/completions"), json=body, headers=headers) as r:
            assert await next_line(r) == ": swap-in queued position=1"
            w.directory.release(CHAT_A.uid)
            assert (await next_line(r, ": swap-in done")).startswith(": swap-in done waited=")
            assert data_of(await next_line(r))["choices"][0]["text"] == " P"
            assert data_of(await next_line(r))["choices"][0]["text"] == " Q"
        slow = route("slow", "team-a", queue_timeout_seconds=0.05)
        w.directory.table.replace([*ALL, slow])
        w.directory.hold(slow.uid)
        async with w.http.post(
            w.url("/ns/team-a/v2/models/slow/infer"),
            json={"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]},
            headers={"X-Modelswap-Progress": "sse"},
        ) as r:
            assert r.status == 200  # committed to the stream before the timeout
            event = await next_line(r, "event:")
            assert event == "event: error"
            error = data_of(await next_line(r))
            assert error["reason"] == "QueueTimeout" and error["status"] == 503
            assert error["retry_after_seconds"] == 1
        labels = {"uid": slow.uid, "namespace": "team-a", "model": "slow"}
        assert w.served.metric("modelswap_gateway_requests_total", **labels, code="503") == 1
        w.directory.release(slow.uid)


@pytest.mark.asyncio
async def test_a_client_that_leaves_while_queued_frees_its_place() -> None:
    async with world(resident=False) as w:
        gateway = w.served.gateway
        w.directory.hold(BERT.uid)
        infer = {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1]}]}
        for progress in (False, True):
            client = await raw_request(
                w.served.url, "/ns/team-a/v2/models/bert/infer", infer, progress
            )
            await until_on_loop(lambda: gateway.queues.depth(BERT.uid) == 1, "one queued")
            client.close()  # the client goes away
            await client.wait_closed()
            await until_on_loop(lambda: gateway.queues.depth(BERT.uid) == 0, "the queue to empty")
            await until_on_loop(
                lambda: w.served.metric("modelswap_gateway_in_flight_requests") == 0,
                "no request in flight",
            )
        labels = {"uid": BERT.uid, "namespace": "team-a", "model": "bert"}
        assert w.served.metric("modelswap_gateway_requests_total", **labels, code="499") == 2
        assert (
            w.served.metric(
                "modelswap_gateway_queue_wait_seconds_count", **labels, outcome="cancelled"
            )
            == 2
        )
        # The swap-in was not cancelled with them: it completes, once.
        assert gateway.queues.swap_in_running(BERT.uid)
        w.directory.release(BERT.uid)
        await until_on_loop(lambda: w.directory.completed[BERT.uid] == 1, "the swap-in to complete")
        await until_on_loop(lambda: gateway.queues.depths() == [], "the queue to go")
        assert w.directory.swap_ins[BERT.uid] == 1
        leftover = [t for t in asyncio.all_tasks() if "gateway" in t.get_name()]
        assert leftover == []

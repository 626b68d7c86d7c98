"""The gateway in front of a real Triton (CPU, from `make setup`): swap-in on request
under load, queue limits, timeouts, disconnects, and OpenAI streams token by token.

A model's "swap-in" here is its real load into Triton (held until the test releases it),
so a request answered correctly proves the gateway waited for it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton
from tests.support.waiting import until

HOST = {"Host": "plain.team-a.svc.cluster.local:8080"}
PLAIN_PATH = "/v2/models/plain/infer"


def infer_body(i: int) -> dict[str, Any]:
    return {"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [i, i + 0.5]}]}


def many_clients() -> aiohttp.ClientSession:
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=400))


async def call(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    async with http.post(url, json=body, headers=headers or HOST) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


def assert_plain_answer(body: Any, i: int, uid: str) -> None:
    assert body["model_name"] == "plain"
    outputs = {o["name"]: o["data"] for o in body["outputs"]}
    assert outputs["OUTPUT0"] == [2 * i, 2 * i + 1]
    assert outputs["UID"] == [uid]


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.asyncio
async def test_200_concurrent_requests_to_a_swapped_out_model_one_swap_in(tmp_path: Path) -> None:
    plain = route("plain", "team-a", max_queued=256)
    async with gateway_over_triton(tmp_path, [Served(plain, "plain")]) as g, many_clients() as http:
        url = g.served.url + PLAIN_PATH
        g.directory.hold(plain.uid)
        tasks = [asyncio.create_task(call(http, url, infer_body(i))) for i in range(200)]
        await until(lambda: g.served.gateway.queues.depth(plain.uid) == 200, "200 queued", 60)
        g.directory.release(plain.uid)  # now the real load into Triton
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for i, (status, body, _) in enumerate(results):
            assert status == 200, body
            assert_plain_answer(body, i, plain.uid)
        assert g.directory.swap_ins[plain.uid] == 1 and g.directory.completed[plain.uid] == 1
        labels = {"uid": plain.uid, "namespace": "team-a", "model": "plain"}
        assert g.served.metric("modelswap_gateway_swap_ins_triggered_total", **labels) == 1
        assert g.served.metric("modelswap_gateway_requests_total", **labels, code="200") == 200
        assert g.served.gateway.queues.depths() == []
        # Metadata and readiness under the user's name, from Triton.
        async with http.get(g.served.url + "/ns/team-a/v2/models/plain") as r:
            assert (await r.json())["name"] == "plain"
        async with http.get(g.served.url + "/ns/team-a/v2/models/plain/ready") as r:
            assert r.status == 200 and r.headers["X-Modelswap-State"] == "RESIDENT"


@pytest.mark.slow
@pytest.mark.timeout(90)
@pytest.mark.asyncio
async def test_max_queued_50_serves_50_and_refuses_150(tmp_path: Path) -> None:
    plain = route("plain", "team-a", max_queued=50)
    async with gateway_over_triton(tmp_path, [Served(plain, "plain")]) as g, many_clients() as http:
        url = g.served.url + PLAIN_PATH
        g.directory.hold(plain.uid)  # a slow swap-in: it goes on only when released
        tasks = [asyncio.create_task(call(http, url, infer_body(i))) for i in range(200)]
        await until(
            lambda: (
                sum(t.done() for t in tasks) == 150
                and g.served.gateway.queues.depth(plain.uid) == 50
            ),
            "150 refusals and 50 waiting",
            60,
        )
        g.directory.release(plain.uid)
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        served = [(i, body) for i, (status, body, _) in enumerate(results) if status == 200]
        refused = [(body, headers) for status, body, headers in results if status == 429]
        assert len(served) == 50 and len(refused) == 150
        for i, body in served:
            assert_plain_answer(body, i, plain.uid)
        for body, headers in refused:
            assert body["reason"] == "QueueFull" and int(headers["Retry-After"]) >= 1
        assert g.directory.swap_ins[plain.uid] == 1
        labels = {"uid": plain.uid, "namespace": "team-a", "model": "plain"}
        assert (
            g.served.metric("modelswap_gateway_refusals_total", **labels, reason="QueueFull") == 150
        )


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_queue_timeout_then_the_swap_in_completes_and_a_disconnect_leaks_nothing(
    tmp_path: Path,
) -> None:
    plain = route("plain", "team-a", queue_timeout_seconds=0.2)
    async with gateway_over_triton(tmp_path, [Served(plain, "plain")]) as g, many_clients() as http:
        gateway = g.served.gateway
        url = g.served.url + PLAIN_PATH
        g.directory.hold(plain.uid)  # the swap-in takes longer than the queue timeout
        results = await asyncio.gather(*(call(http, url, infer_body(i)) for i in range(3)))
        for status, body, headers in results:
            assert status == 503 and body["reason"] == "QueueTimeout"
            assert int(headers["Retry-After"]) >= 1
        assert gateway.queues.depth(plain.uid) == 0 and gateway.queues.swap_in_running(plain.uid)

        # A client that goes away while queued frees its place.
        reader, writer = await asyncio.open_connection(
            *g.served.url.removeprefix("http://").split(":")
        )
        payload = json.dumps(infer_body(9)).encode()
        writer.write(
            f"POST /ns/team-a{PLAIN_PATH} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        await writer.drain()
        await until(lambda: gateway.queues.depth(plain.uid) == 1, "the client queued")
        writer.close()
        await writer.wait_closed()
        await until(lambda: gateway.queues.depth(plain.uid) == 0, "its place freed")
        await until(
            lambda: g.served.metric("modelswap_gateway_in_flight_requests") == 0,
            "nothing in flight",
        )
        del reader

        g.directory.release(plain.uid)
        await until(lambda: g.directory.completed[plain.uid] == 1, "the swap-in to complete", 30)
        status, body, _ = await call(http, url, infer_body(4))
        assert status == 200
        assert_plain_answer(body, 4, plain.uid)
        assert g.directory.swap_ins[plain.uid] == 1
        assert gateway.queues.depths() == []
        assert [t for t in asyncio.all_tasks() if "gateway" in t.get_name()] == []
        labels = {"uid": plain.uid, "namespace": "team-a", "model": "plain"}
        assert g.served.metric("modelswap_gateway_requests_total", **labels, code="503") == 3
        assert g.served.metric("modelswap_gateway_requests_total", **labels, code="499") == 1


@pytest.mark.timeout(60)
@pytest.mark.asyncio
async def test_openai_streams_token_by_token_and_aggregates(tmp_path: Path) -> None:
    pace = tmp_path / "pace"
    pace.mkdir()
    tokens = route("tokens", "team-a", decoupled=True)
    models = [Served(tokens, "tokens", {"pace_dir": str(pace)})]
    async with (
        gateway_over_triton(tmp_path, models, progress_interval_seconds=0.05) as g,
        aiohttp.ClientSession() as http,
    ):
        g.directory.hold(tokens.uid)
        body = {"model": "tokens", "prompt": "one two three four", "stream": True}
        headers = {"Host": "tokens.team-a.svc", "Accept": "text/event-stream"}
        async with http.post(g.served.url + "/v1/completions", json=body, headers=headers) as r:
            assert r.status == 200
            assert await next_line(r) == ": swap-in queued position=1"
            g.directory.release(tokens.uid)  # the real load
            for index, word in enumerate(["ONE", "TWO", "THREE", "FOUR"]):
                chunk = json.loads((await next_line(r, "data: ")).removeprefix("data: "))
                assert chunk["choices"][0]["text"] == " " + word
                # Chunk `index` reached us before the model generated token index+1:
                # the model waits for go-<index+1>, which only we create, only now.
                assert not (pace / f"sent-{index + 1}").exists()
                (pace / f"go-{index + 1}").touch()
            last = json.loads((await next_line(r, "data: ")).removeprefix("data: "))
            assert last["choices"][0]["finish_reason"] == "stop"
            assert await next_line(r) == "data: [DONE]"

        # Not streaming: the stream aggregated (the pacing files exist now).
        body = {"model": "tokens", "prompt": "one two three four", "max_tokens": 3}
        async with http.post(g.served.url + "/ns/team-a/v1/completions", json=body) as r:
            answer = await r.json()
        assert answer["choices"][0] == {
            "index": 0,
            "text": " ONE TWO THREE",
            "logprobs": None,
            "finish_reason": "length",
        }
        chat = {"model": "tokens", "messages": [{"role": "user", "content": "hi"}]}
        async with http.post(g.served.url + "/ns/team-a/v1/chat/completions", json=chat) as r:
            answer = await r.json()
        assert answer["choices"][0]["message"]["content"] == " USER: HI ASSISTANT:"
        # v2 generate_stream through the gateway, under the user's name.
        async with http.post(
            g.served.url + "/ns/team-a/v2/models/tokens/generate_stream",
            json={"text_input": "x y", "parameters": {"max_tokens": 1}},
        ) as r:
            events = [
                json.loads(line[6:])
                for line in (await r.text()).splitlines()
                if line.startswith("data: ")
            ]
        assert events == [
            {
                "model_name": "tokens",
                "model_version": "1",
                "text_output": " X",
                "token_ids": 0,  # Triton writes a one-element tensor as a number
                "prompt_tokens": 2,
                "finish_reason": "length",
            }
        ]
        # Triton refuses infer on a decoupled model; the gateway says so before any swap-in.
        async with http.post(g.served.url + "/ns/team-a/v2/models/tokens/infer", json={}) as r:
            assert r.status == 400 and "generate_stream" in (await r.json())["error"]
        assert g.directory.swap_ins[tokens.uid] == 1


async def next_line(response: aiohttp.ClientResponse, prefix: str = "") -> str:
    while True:
        raw = await asyncio.wait_for(response.content.readline(), 30)
        assert raw, "the stream ended"
        line = raw.decode().rstrip("\n")
        if line and line.startswith(prefix):
            return line

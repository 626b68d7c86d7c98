"""Generation's bounds and the ending of a model's requests over HTTP (issue 26, item 3),
with the fake Triton whose token stream the test paces (fast: no Triton; the same against
the real one: tests/integration/test_reliability_generation.py)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest
from aiohttp.test_utils import make_mocked_request

from modelswap_sidecar.gateway.app import _answer_ended
from modelswap_sidecar.gateway.context import Call
from modelswap_sidecar.gateway.errors import RequestEndedError
from modelswap_sidecar.gateway.exchange import Exchange
from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world
from tests.support.waiting import until_on_loop

CHAT = dataclasses.replace(
    route("chat", "team-a", decoupled=True), max_tokens=3, max_prompt_bytes=64
)
WORDS = "a b c d e f g h i j"


class World(GatewayWorld):
    def url(self, path: str) -> str:
        return self.served.url + "/ns/team-a" + path


def world(*, resident: bool = True) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, [CHAT], resident=resident)


def data_lines(raw: bytes) -> list[Any]:
    return [json.loads(line[6:]) for line in raw.splitlines() if line.startswith(b"data: {")]


@pytest.mark.asyncio
async def test_bounds_refuse_before_any_swap_in() -> None:
    async with world(resident=False) as w:
        for path, body, field in [
            ("/v1/completions", {"model": "chat", "prompt": "a", "max_tokens": 4}, "max_tokens"),
            ("/v1/completions", {"model": "chat", "prompt": "x" * 65}, "prompt"),
            ("/v1/chat/completions",
             {"model": "chat", "messages": [{"role": "user", "content": "x" * 60}]}, "messages"),
            ("/v2/models/chat/generate_stream", {"text_input": "x" * 65}, "text_input"),
            ("/v2/models/chat/generate_stream",
             {"text_input": "a", "parameters": {"max_tokens": 2**70}}, "parameters.max_tokens"),
        ]:  # fmt: skip
            async with w.http.post(w.url(path), json=body) as r:
                answer = await r.json()
                assert r.status == 400, answer
            error = answer["error"]
            message = error["message"] if isinstance(error, dict) else error
            assert message.startswith(f"{field}: "), message
        assert w.directory.swap_ins[CHAT.uid] == 0
        assert w.triton.calls == []


@pytest.mark.asyncio
async def test_a_generation_that_asked_no_length_ends_after_max_tokens_responses() -> None:
    async with world() as w:
        async with w.http.post(
            w.url("/v1/completions"), json={"model": "chat", "prompt": WORDS}
        ) as r:
            answer = await r.json()
        assert answer["choices"][0]["text"] == " A B C"
        assert answer["choices"][0]["finish_reason"] == "length"
        async with w.http.post(
            w.url("/v2/models/chat/generate_stream"), json={"text_input": WORDS}
        ) as r:
            events = data_lines(await r.read())
        assert [e["text_output"] for e in events] == [" A", " B", " C"]
        # asked within the bound: as the model answers
        async with w.http.post(
            w.url("/v1/completions"), json={"model": "chat", "prompt": WORDS, "max_tokens": 2}
        ) as r:
            assert (await r.json())["choices"][0]["text"] == " A B"


@pytest.mark.asyncio
async def test_end_requests_answers_503_drain_deadline_and_closes_triton_s_stream() -> None:
    async with world() as w:
        w.triton.paced = True  # token i >= 1 is generated only after allow(i)
        app = w.served.app
        body = {"model": "chat", "prompt": WORDS, "stream": True, "max_tokens": 3}
        async with w.http.post(w.url("/v1/completions"), json=body) as streamed:
            assert streamed.status == 200
            first = await streamed.content.readline()
            assert json.loads(first[6:])["choices"][0]["text"] == " A"
            plain_body = {"model": "chat", "prompt": WORDS, "max_tokens": 3}
            plain = w.http.post(w.url("/v1/completions"), json=plain_body)
            task = asyncio.ensure_future(plain)
            await until_on_loop(
                lambda: app.gateway.at_triton.count(CHAT.triton_name) == 2, "both at Triton"
            )
            assert app.end_requests(CHAT.triton_name, "the drain waited for it") == 2
            rest = data_lines(await streamed.read())
        assert rest[-1]["error"]["code"] == "DrainDeadline"
        async with await task as r:
            answer = await r.json()
            assert r.status == 503 and r.headers["Retry-After"] == "1"
        assert answer["error"] == {
            "message": "the drain waited for it",
            "type": "server_error",
            "param": None,
            "code": "DrainDeadline",
        }
        assert app.gateway.at_triton.count(CHAT.triton_name) == 0
        assert w.directory.in_flight[CHAT.uid] == 0
        # both connections to Triton were closed, not kept for reuse (Triton cancels)
        await until_on_loop(
            lambda: app.gateway.upstream.open_connections == 0, "Triton's connections to close"
        )
        for index in range(1, len(WORDS.split())):  # the fake Triton's handlers end
            w.triton.allow(index)
        # nothing else changed: the next request is answered
        w.triton.paced = False
        async with w.http.post(w.url("/v1/completions"), json=plain_body) as r:
            assert (await r.json())["choices"][0]["text"] == " A B C"


@pytest.mark.asyncio
async def test_a_request_ended_just_as_its_stream_ended_keeps_its_answer() -> None:
    """The drain's deadline and a stream's last write can meet: the stream is returned as
    it ended, not failed again (a write after its end raises)."""
    async with world() as w:
        call = Call(w.served.app.gateway, make_mocked_request("POST", "/v1/completions"))
        call.flavour = "openai"
        exchange = Exchange(call, CHAT, progress=False)
        stream = await exchange.stream()
        await stream.write_eof()
        error = RequestEndedError("the drain waited for it", retry_after_seconds=1)
        assert await _answer_ended(call, error) is stream

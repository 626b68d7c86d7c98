"""A conversation's session passed to the model (issue 29, item 2): the `X-Modelswap-Session`
header, else OpenAI's `user` (v2 generate: else `parameters.session_id`), reaches the model
as the request parameter `session_id`, scoped `namespace/name/id` so two namespaces'
(or models') sessions of one id never meet; a session id that is not one is a 400 naming
where it came from, before anything reaches Triton. Over the gateway in front of the
fake Triton, which keeps each generate_stream body it was sent."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from typing import Any

import pytest

from modelswap_sidecar.gateway import generation
from modelswap_sidecar.gateway.errors import BadRequestError
from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world

CHAT_A = route("chat", "team-a", decoupled=True)
CHAT_B = route("chat", "team-b", decoupled=True)
OTHER_A = route("other", "team-a", decoupled=True)
HEADER = "X-Modelswap-Session"


class World(GatewayWorld):
    async def post(
        self, namespace: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
    ) -> tuple[int, Any]:
        url = f"{self.served.url}/ns/{namespace}{path}"
        async with self.http.post(url, json=body, headers=headers or {}) as r:
            raw = await r.read()
            return r.status, raw

    def sessions(self) -> list[str | None]:
        """The `session_id` parameter of each generate_stream body Triton got, in order."""
        return [
            (body.get("parameters") or {}).get("session_id") for body in self.triton.generate_bodies
        ]


def world() -> AbstractAsyncContextManager[World]:
    return gateway_world(World, [CHAT_A, CHAT_B, OTHER_A], resident=True)


COMPLETION = {"model": "chat", "prompt": "a b", "max_tokens": 2}
CHAT = {"model": "chat", "messages": [{"role": "user", "content": "a b"}], "max_tokens": 2}


@pytest.mark.asyncio
async def test_openai_routes_pass_the_session_scoped_to_namespace_and_model() -> None:
    async with world() as w:
        for namespace, path, body, headers in [
            ("team-a", "/v1/completions", {**COMPLETION, "user": "u1"}, None),
            ("team-b", "/v1/completions", {**COMPLETION, "user": "u1"}, None),
            ("team-a", "/v1/chat/completions", {**CHAT, "stream": True, "user": "u1"}, None),
            # the header wins over `user`
            ("team-a", "/v1/chat/completions", {**CHAT, "user": "u1"}, {HEADER: "conv-7"}),
            ("team-a", "/v1/completions", {**COMPLETION, "model": "other"}, {HEADER: "conv-7"}),
            # no session named: no parameter (the model keeps no cache for it)
            ("team-a", "/v1/completions", COMPLETION, None),
        ]:
            status, raw = await w.post(namespace, path, body, headers)
            assert status == 200, raw
        assert w.sessions() == [
            "team-a/chat/u1",
            "team-b/chat/u1",
            "team-a/chat/u1",
            "team-a/chat/conv-7",
            "team-a/other/conv-7",
            None,
        ]
        # the other parameters are as they were
        assert w.triton.generate_bodies[0]["parameters"]["max_tokens"] == 2


@pytest.mark.asyncio
async def test_v2_generate_scopes_the_session_of_the_header_or_its_parameter() -> None:
    async with world() as w:
        path = "/v2/models/chat/generate_stream"
        for namespace, body, headers in [
            ("team-a", {"text_input": "a", "parameters": {"session_id": "s1"}}, None),
            ("team-b", {"text_input": "a", "parameters": {"session_id": "s1"}}, None),
            ("team-a", {"text_input": "a"}, {HEADER: "s2"}),
            ("team-a", {"text_input": "a", "parameters": {"session_id": "s1"}}, {HEADER: "s2"}),
            # a client naming another namespace's session only names one of its own
            ("team-a", {"text_input": "a", "parameters": {"session_id": "team-b/chat/s1"}}, None),
            ("team-a", {"text_input": "a b c", "parameters": {"max_tokens": 1}}, None),
        ]:
            status, raw = await w.post(namespace, path, body, headers)
            assert status == 200, raw
        assert w.sessions() == [
            "team-a/chat/s1",
            "team-b/chat/s1",
            "team-a/chat/s2",
            "team-a/chat/s2",
            "team-a/chat/team-b/chat/s1",
            None,
        ]
        # a body naming no session goes to Triton as it came
        assert w.triton.generate_bodies[-1] == {
            "text_input": "a b c",
            "parameters": {"max_tokens": 1},
        }


@pytest.mark.asyncio
async def test_a_session_that_is_not_one_is_a_400_naming_its_source_before_triton() -> None:
    async with world() as w:
        for path, body, headers, field in [
            ("/v1/completions", {**COMPLETION, "user": 7}, None, "user"),
            ("/v1/completions", {**COMPLETION, "user": ""}, None, "user"),
            ("/v1/chat/completions", {**CHAT, "user": "x" * 257}, None, "user"),
            ("/v1/completions", COMPLETION, {HEADER: "a\tb"}, HEADER),
            ("/v2/models/chat/generate_stream",
             {"text_input": "a", "parameters": {"session_id": 3}}, None, "parameters.session_id"),
            ("/v2/models/chat/generate_stream", {"text_input": "a"}, {HEADER: "y" * 300}, HEADER),
        ]:  # fmt: skip
            status, raw = await w.post("team-a", path, body, headers)
            assert status == 400, raw
            assert f'"{field}: ' in raw.decode(), raw
        assert w.triton.generate_bodies == []


def test_session_of_bounds_and_precedence() -> None:
    assert generation.session_of(None, None, "user") is None
    assert generation.session_of("h", "u", "user") == "h"
    assert generation.session_of(None, "u" * 256, "user") == "u" * 256
    for bad in ("", "u" * 257, "a\x00b", "a\x7fb"):
        with pytest.raises(BadRequestError):
            generation.session_of(None, bad, "user")
    with pytest.raises(BadRequestError, match=r"^user: must be a string$"):
        generation.session_of(None, ["u"], "user")
    assert generation.scoped_session(CHAT_A, "é/x") == "team-a/chat/é/x"


@pytest.mark.asyncio
async def test_grpc_passes_the_session_of_its_metadata_or_parameter_scoped() -> None:
    import grpc
    from tritonclient.grpc import service_pb2

    from tests.unit.test_gateway_grpc_bounds import NS, fp32, world

    def request(session: str | int | None = None) -> service_pb2.ModelInferRequest:
        r = fp32([1, 2], b"\0" * 8)
        if isinstance(session, str):
            r.parameters["session_id"].string_param = session
        elif isinstance(session, int):
            r.parameters["session_id"].int64_param = session
        return r

    async with world(resident=True) as w:
        await w.stub.ModelInfer(request("s1"), metadata=NS, timeout=30)
        await w.stub.ModelInfer(request("s1"), metadata=(*NS, (HEADER.lower(), "s2")), timeout=30)
        await w.stub.ModelInfer(request(), metadata=NS, timeout=30)

        async def stream() -> Any:
            yield request("s3")

        _ = [a async for a in w.stub.ModelStreamInfer(stream(), metadata=NS, timeout=30)]
        sessions = [
            r.parameters["session_id"].string_param if "session_id" in r.parameters else None
            for r in w.triton.got
        ]
        assert sessions == ["team-a/m/s1", "team-a/m/s2", None, "team-a/m/s3"]
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await w.stub.ModelInfer(request(7), metadata=NS, timeout=30)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details() == "parameters.session_id: must be a string"
        assert len(w.triton.got) == 4  # refused before Triton

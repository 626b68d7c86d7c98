"""Which endpoint a path names (`gateway.paths`), and what the server answers for a path,
method or expectation it does not serve."""

from __future__ import annotations

import asyncio
import json

import pytest

from modelswap_sidecar.gateway.paths import Endpoint, PathMatch, PathTable
from tests.unit.test_gateway_v2 import infer_body, world


def table() -> PathTable[str]:
    paths: PathTable[str] = PathTable()
    for tail in ("", "/infer", "/ready"):
        paths.v2_model(tail, Endpoint("POST" if tail else "GET", "model" + tail, "v2"))
    paths.v2_model("/config", Endpoint("GET", "config", "v2"), versioned=False)
    paths.fixed("/v2/health/live", Endpoint("GET", "live", "v2"))
    paths.fixed("/v2", Endpoint("GET", "server", "v2"))
    paths.scoped("/v1/models", Endpoint("GET", "list", "openai"))
    paths.scoped("/v1/chat/completions", Endpoint("POST", "chat", "openai"))
    paths.openai_model(Endpoint("GET", "one", "openai"))
    return paths


def named(path: str) -> tuple[str, str | None, str | None, str | None] | None:
    found = table().match(path)
    if found is None:
        return None
    assert isinstance(found, PathMatch)
    return found.endpoint.handler, found.namespace, found.model, found.version


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/v2/models/llama/infer", ("model/infer", None, "llama", None)),
        ("/v2/models/llama", ("model", None, "llama", None)),
        ("/ns/team-a/v2/models/llama/versions/3/infer", ("model/infer", "team-a", "llama", "3")),
        ("/v2/models/llama/versions/3", ("model", None, "llama", "3")),
        ("/v2/models/llama/config", ("config", None, "llama", None)),
        ("/v2/models/a%2Fb/ready", ("model/ready", None, "a/b", None)),
        ("/ns/a%25b/v2/models/m", ("model", "a%b", "m", None)),
        ("/v2/health/live", ("live", None, None, None)),
        ("/v2", ("server", None, None, None)),
        ("/v1/models", ("list", None, None, None)),
        ("/ns/team-a/v1/models", ("list", "team-a", None, None)),
        ("/ns/team-a/v1/chat/completions", ("chat", "team-a", None, None)),
        ("/v1/models/team-a/llama", ("one", None, "team-a/llama", None)),
        ("/ns/team-a/v1/models/llama", ("one", "team-a", "llama", None)),
    ],
)
def test_each_shape_names_its_endpoint_and_parameters(
    path: str, expected: tuple[str, str | None, str | None, str | None]
) -> None:
    assert named(path) == expected


@pytest.mark.parametrize(
    "path",
    [
        "/",
        "/v2/",
        "/v2/models/llama/",  # a trailing slash is another path
        "/v2/models//infer",  # an empty model
        "/v2/models/llama/versions//infer",  # an empty version
        "/v2/models/llama/versions",
        "/v2/models/llama/versions/3/config",  # Triton has no per-version config
        "/v2/models/llama/versions/3/infer/more",
        "/v2/models/llama/explain",
        "/ns/team-a/v2/health/live",  # fixed paths take no namespace
        "/ns//v2/models/llama",
        "/ns/team-a",
        "/v1/models/",  # an empty model
        "/ns/a/ns/b/v1/models",
        "/v1/completions/x",
    ],
)
def test_other_paths_name_nothing(path: str) -> None:
    assert named(path) is None


async def _raw(port: int, request: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        writer.write(request)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()


@pytest.mark.asyncio
async def test_an_unknown_path_is_a_404_and_another_method_a_405_in_the_routes_form() -> None:
    async with world() as w:
        async with w.http.get(w.served.url + "/v2/nothing/here") as r:
            body = await r.json(content_type=None)
            assert r.status == 404 and body["reason"] == "NotFound"
            assert "/v2/nothing/here" in body["error"]
        async with w.http.get(w.served.url + "/ns/team-a/v2/models/llama/infer") as r:
            body = await r.json(content_type=None)
            assert r.status == 405 and body["reason"] == "MethodNotAllowed"
            assert "use POST" in body["error"]
        async with w.http.get(w.served.url + "/ns/team-a/v1/completions") as r:
            body = await r.json(content_type=None)  # an OpenAI route's error form
            assert r.status == 405 and body["error"]["code"] == "MethodNotAllowed"
        async with w.http.head(w.served.url + "/v2/health/live") as r:
            assert r.status == 405
        assert w.triton.calls == [] and w.directory.requests == []
        assert w.served.metric("modelswap_gateway_requests_total", uid="", namespace="",
                               model="", code="404") == 1  # fmt: skip


@pytest.mark.asyncio
async def test_expect_100_continue_is_answered_before_the_body_is_sent() -> None:
    """curl sends large bodies after `Expect: 100-continue`: the gateway says continue at
    once (without it the client waits a second before sending anyway)."""
    async with world() as w:
        port = int(w.served.url.rsplit(":", 1)[1])
        body = json.dumps(infer_body([4])).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(
                b"POST /ns/team-a/v2/models/llama/infer HTTP/1.1\r\nHost: x\r\n"
                b"Content-Type: application/json\r\nExpect: 100-continue\r\n"
                b"Content-Length: %d\r\n\r\n" % len(body)
            )
            await writer.drain()
            interim = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert interim == b"HTTP/1.1 100 Continue\r\n\r\n"
            writer.write(body)
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            assert head.startswith(b"HTTP/1.1 200 ")
        finally:
            writer.close()


@pytest.mark.asyncio
async def test_an_unknown_expectation_is_a_417() -> None:
    async with world() as w:
        port = int(w.served.url.rsplit(":", 1)[1])
        head = await _raw(
            port,
            b"POST /ns/team-a/v2/models/llama/infer HTTP/1.1\r\nHost: x\r\n"
            b"Expect: 200-ok\r\nContent-Length: 2\r\n\r\n{}",
        )
        assert head.startswith(b"HTTP/1.1 417 ")
        assert w.triton.calls == []

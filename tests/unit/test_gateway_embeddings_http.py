"""`POST /v1/embeddings` over HTTP on loopback: the gateway in front of a scripted Triton
that serves the embedding contract (config and binary infer), with a fake directory whose
swap-in the test holds and releases."""

from __future__ import annotations

import array
import asyncio
import base64
import contextlib
import gzip
import json
import struct
from collections import Counter
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from aiohttp import web

from modelswap_sidecar.gateway.directory import ModelRoute
from modelswap_sidecar.gateway.embeddings import MAX_INPUTS
from tests.support.gateway_fakes import route
from tests.support.gateway_world import GatewayWorld, gateway_world
from tests.support.waiting import until_on_loop

EMBED = route("embed", "team-a")
EMBED_B = route("embed", "team-b")
PLAIN = route("plain", "team-a")
CHAT = route("chat", "team-a", decoupled=True)
ALL = (EMBED, EMBED_B, PLAIN, CHAT)
HOST_A = {"Host": "embed.team-a.svc.cluster.local:8080"}
WIDTH = 3

CONTRACT_CONFIG = {
    "max_batch_size": 0,
    "input": [{"name": "text_input", "data_type": "TYPE_STRING", "dims": [-1]}],
    "output": [
        {"name": "embedding", "data_type": "TYPE_FP32", "dims": [-1, -1]},
        {"name": "prompt_tokens", "data_type": "TYPE_INT64", "dims": [-1]},
    ],
}
PLAIN_CONFIG = {
    "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
}


def row_of(text: str, index: int) -> list[float]:
    """The scripted model's row for a string: its length in characters, its place, 0.5."""
    return [float(len(text)), float(index), 0.5]


@dataclass
class ScriptedTriton:
    """Triton's config and infer, as far as the embeddings route uses them."""

    configs: dict[str, Any]
    loaded: set[str] = field(default_factory=set)
    config_reads: Counter[str] = field(default_factory=Counter)
    #: the strings each infer carried, decoded from the binary input
    infers: list[list[str]] = field(default_factory=list)
    #: per Triton name: (status, JSON body) answered instead of an embedding
    refusals: dict[str, tuple[int, Any]] = field(default_factory=dict)
    #: rows answered short by one (a model breaking its contract)
    short_answer: bool = False
    config_status: int | None = None
    url: str = ""

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/v2/models/{m}/config", self._config)
        app.router.add_post("/v2/models/{m}/infer", self._infer)
        return app

    def _unknown(self, name: str) -> web.Response:
        body = {"error": f"Request for unknown model: '{name}' is not found"}
        return web.json_response(body, status=400)

    async def _config(self, request: web.Request) -> web.Response:
        name = request.match_info["m"]
        self.config_reads[name] += 1
        if self.config_status is not None:
            return web.json_response({"error": f"{name} config broke"}, status=self.config_status)
        if name not in self.loaded:
            return self._unknown(name)
        return web.json_response({"name": name, **self.configs[name]})

    async def _infer(self, request: web.Request) -> web.Response:
        name = request.match_info["m"]
        if name not in self.loaded:
            return self._unknown(name)
        raw = await request.read()
        header_length = int(request.headers["Inference-Header-Content-Length"])
        header = json.loads(raw[:header_length])
        data = raw[header_length:]
        texts, offset = [], 0
        while offset < len(data):
            (size,) = struct.unpack_from("<I", data, offset)
            texts.append(data[offset + 4 : offset + 4 + size].decode())
            offset += 4 + size
        assert header["inputs"][0]["shape"] == [len(texts)]
        self.infers.append(texts)
        if name in self.refusals:
            status, body = self.refusals[name]
            return web.json_response(body, status=status)
        rows = [row_of(text, i) for i, text in enumerate(texts)]
        if self.short_answer:
            rows = rows[:-1]
        blob = array.array("f", [v for row in rows for v in row]).tobytes()
        outputs = [
            {
                "name": "embedding",
                "datatype": "FP32",
                "shape": [len(rows), WIDTH],
                "parameters": {"binary_data_size": len(blob)},
            },
            {
                "name": "prompt_tokens",
                "datatype": "INT64",
                "shape": [len(texts)],
                "data": [len(t.encode()) for t in texts],
            },
        ]
        answer = json.dumps({"model_name": name, "model_version": "1", "outputs": outputs})
        return web.Response(
            body=answer.encode() + blob,
            headers={
                "Content-Type": "application/octet-stream",
                "Inference-Header-Content-Length": str(len(answer.encode())),
            },
        )


@dataclass
class World(GatewayWorld):
    triton: ScriptedTriton  # type: ignore[assignment]

    def url(self, path: str) -> str:
        return self.served.url + path

    async def embed(
        self, body: Any, path: str = "/v1/embeddings", headers: dict[str, str] | None = None
    ) -> tuple[int, Any, dict[str, str]]:
        async with self.http.post(
            self.url(path), json=body, headers=HOST_A if headers is None else headers
        ) as r:
            return r.status, await r.json(content_type=None), dict(r.headers)


@contextlib.asynccontextmanager
async def world(
    *, resident: bool = True, routes: tuple[ModelRoute, ...] = ALL, **settings: Any
) -> AsyncIterator[World]:
    configs = {r.triton_name: CONTRACT_CONFIG for r in routes if r.name == "embed"}
    configs[PLAIN.triton_name] = PLAIN_CONFIG
    async with gateway_world(
        World, routes, resident=resident, triton=ScriptedTriton(configs), **settings
    ) as w:
        yield w


def labels(r: ModelRoute) -> dict[str, str]:
    return {"uid": r.uid, "namespace": r.namespace, "model": r.name}


def assert_rows(answer: Any, texts: list[str]) -> None:
    assert answer["object"] == "list"
    assert [entry["index"] for entry in answer["data"]] == list(range(len(texts)))
    for i, (entry, text) in enumerate(zip(answer["data"], texts, strict=True)):
        assert entry["object"] == "embedding"
        embedding = entry["embedding"]
        if isinstance(embedding, str):
            embedding = array.array("f", base64.b64decode(embedding)).tolist()
        assert embedding == row_of(text, i)
    tokens = sum(len(t.encode()) for t in texts)
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


@pytest.mark.asyncio
async def test_a_swapped_out_model_is_swapped_in_once_and_answers_in_openais_shape() -> None:
    async with world(resident=False) as w:
        w.directory.hold(EMBED.uid)
        texts = ["a", "bb", "ccc é"]
        tasks = [asyncio.create_task(w.embed({"model": "embed", "input": texts})) for _ in range(5)]
        await until_on_loop(
            lambda: w.served.gateway.queues.depth(EMBED.uid) == 5, "five requests queued"
        )
        assert w.triton.infers == []
        w.directory.release(EMBED.uid)
        for status, answer, headers in await asyncio.gather(*tasks):
            assert status == 200, answer
            assert answer["model"] == "embed"
            assert_rows(answer, texts)
            assert float(headers["X-Modelswap-Queue-Wait-Seconds"]) >= 0
        assert w.directory.swap_ins[EMBED.uid] == 1
        assert w.triton.infers == [texts] * 5
        reads = w.triton.config_reads[EMBED.triton_name]
        # Resident now and its contract known: no more reads of its configuration.
        status, answer, _ = await w.embed(
            {"model": "embed", "input": "x", "encoding_format": "base64"}
        )
        assert status == 200 and isinstance(answer["data"][0]["embedding"], str)
        assert_rows(answer, ["x"])
        assert w.triton.config_reads[EMBED.triton_name] == reads
        assert w.served.metric("modelswap_gateway_requests_total", **labels(EMBED), code="200") == 6
        assert w.served.metric("modelswap_gateway_swap_ins_triggered_total", **labels(EMBED)) == 1
        assert {uid for uid, _ in w.directory.requests} == {EMBED.uid}
        assert len(w.directory.requests) >= 6  # each request's time, for the idle policy
        assert w.directory.in_flight[EMBED.uid] == 0
        # Swapped out again: the next embeddings request swaps it in again.
        w.directory.swap_out(EMBED.uid)
        w.triton.loaded.discard(EMBED.triton_name)
        status, answer, _ = await w.embed({"model": "embed", "input": ["again"]})
        assert status == 200 and w.directory.swap_ins[EMBED.uid] == 2
        assert_rows(answer, ["again"])


@pytest.mark.asyncio
async def test_the_model_is_named_as_on_the_other_openai_routes() -> None:
    async with world() as w:
        status, answer, _ = await w.embed(
            {"model": "embed", "input": "x"}, "/ns/team-b/v1/embeddings", {}
        )
        assert status == 200 and w.triton.infers == [["x"]]
        assert (
            w.served.metric("modelswap_gateway_requests_total", **labels(EMBED_B), code="200") == 1
        )
        status, answer, _ = await w.embed({"model": "team-b/embed", "input": "y"}, headers={})
        assert status == 200 and answer["model"] == "team-b/embed"
        status, answer, _ = await w.embed(
            {"model": "team-b/embed", "input": "y"}, "/ns/team-a/v1/embeddings", {}
        )
        assert status == 400 and answer["error"]["code"] == "BadRequest"
        status, answer, _ = await w.embed({"model": "embed", "input": "y"}, headers={})
        assert status == 400 and answer["error"]["code"] == "NamespaceRequired"
        status, answer, _ = await w.embed({"model": "nope", "input": "y"})
        assert status == 404 and answer["error"]["code"] == "ModelNotFound"
        assert answer["error"]["type"] == "invalid_request_error"
        # /v1/models lists the embedding model with the others.
        async with w.http.get(w.url("/v1/models"), headers=HOST_A) as r:
            listed = [m["id"] for m in (await r.json())["data"]]
        assert listed == ["chat", "embed", "plain"]
    async with world(local_mode=True) as w:
        status, answer, _ = await w.embed({"model": "embed", "input": "y"}, headers={})
        assert status == 409 and answer["error"]["code"] == "AmbiguousModel"
        status, answer, _ = await w.embed({"model": "team-a/embed", "input": "y"}, headers={})
        assert status == 200


@pytest.mark.asyncio
async def test_bad_requests_are_refused_before_any_swap_in() -> None:
    async with world(resident=False, max_openai_body_bytes=4096) as w:
        for body, field_name in [
            ({"model": "embed", "input": [1, 2]}, "input: token ids"),
            ({"model": "embed", "input": [[1, 2]]}, "input: token ids"),
            ({"model": "embed", "input": ""}, "input[0]"),
            ({"model": "embed", "input": []}, "input"),
            ({"model": "embed", "input": ["x"] * (MAX_INPUTS + 1)}, "input: at most 2048"),
            ({"model": "embed", "input": "x", "encoding_format": "hex"}, "encoding_format"),
            ({"model": "embed", "input": "x", "dimensions": 0}, "dimensions"),
            ({"input": "x"}, "model"),
        ]:
            size = len(json.dumps(body))
            status, answer, _ = await w.embed(body)
            expected = 413 if size > 4096 else 400
            assert status == expected, (body, answer)
            if expected == 400:
                assert answer["error"]["message"].startswith(field_name), answer
                assert answer["error"]["type"] == "invalid_request_error"
        deep = b'{"model": "embed", "input": ' + b"[" * 100 + b"]" * 100 + b"}"
        async with w.http.post(w.url("/v1/embeddings"), data=deep, headers=HOST_A) as r:
            assert r.status == 400 and "nested deeper" in (await r.json())["error"]["message"]
        async with w.http.post(w.url("/v1/embeddings"), data=b"{", headers=HOST_A) as r:
            assert r.status == 400 and "not JSON" in (await r.json())["error"]["message"]
        # A decoupled model cannot answer infer: refused before its swap-in.
        status, answer, _ = await w.embed({"model": "chat", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "NotAnEmbeddingModel"
        assert "decoupled" in answer["error"]["message"]
        assert w.directory.swap_ins == Counter()
        assert w.triton.config_reads == Counter()
        async with w.http.get(w.url("/v1/embeddings"), headers=HOST_A) as r:
            assert r.status == 405
        # The size and encoding limits of every body hold here too.
        packed = gzip.compress(json.dumps({"model": "embed", "input": "x" * 8000}).encode())
        async with w.http.post(
            w.url("/v1/embeddings"),
            data=packed,
            headers={**HOST_A, "Content-Encoding": "gzip"},
        ) as r:
            assert r.status == 413 and (await r.json())["error"]["code"] == "PayloadTooLarge"


@pytest.mark.asyncio
async def test_a_gzip_body_is_decoded() -> None:
    async with world() as w:
        packed = gzip.compress(json.dumps({"model": "embed", "input": ["p", "q"]}).encode())
        async with w.http.post(
            w.url("/v1/embeddings"), data=packed, headers={**HOST_A, "Content-Encoding": "gzip"}
        ) as r:
            assert r.status == 200
            assert_rows(await r.json(), ["p", "q"])


@pytest.mark.asyncio
async def test_a_model_without_the_contract_is_refused_naming_what_it_lacks() -> None:
    async with world(resident=False) as w:
        # Triton still holds it (swapped out with onSwapOut: host): refused without a swap-in.
        w.triton.loaded.add(PLAIN.triton_name)
        status, answer, _ = await w.embed({"model": "plain", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "NotAnEmbeddingModel"
        message = answer["error"]["message"]
        assert message.startswith("plain does not serve embeddings")
        for part in ("no input text_input", "no output embedding", "no output prompt_tokens"):
            assert part in message
        assert PLAIN.triton_name not in message
        assert w.directory.swap_ins[PLAIN.uid] == 0 and w.triton.infers == []
        # Dropped (Triton does not hold it): swapped in first, then refused; never cached.
        w.triton.loaded.discard(PLAIN.triton_name)
        status, answer, _ = await w.embed({"model": "plain", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "NotAnEmbeddingModel"
        assert w.directory.swap_ins[PLAIN.uid] == 1 and w.triton.infers == []
        reads = w.triton.config_reads[PLAIN.triton_name]
        status, _, _ = await w.embed({"model": "plain", "input": "x"})
        assert status == 400 and w.triton.config_reads[PLAIN.triton_name] == reads + 1
        labels_plain = labels(PLAIN)
        assert w.served.metric("modelswap_gateway_requests_total", **labels_plain, code="400") == 3


@pytest.mark.asyncio
async def test_tritons_refusal_is_relayed_renamed_and_the_contract_read_again() -> None:
    async with world() as w:
        status, _, _ = await w.embed({"model": "embed", "input": "x"})
        assert status == 200 and w.triton.config_reads[EMBED.triton_name] == 1
        name = EMBED.triton_name
        w.triton.refusals[name] = (400, {"error": f"unexpected inference input for '{name}'"})
        status, answer, _ = await w.embed({"model": "embed", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "TritonError"
        assert answer["error"]["message"] == "unexpected inference input for 'embed'"
        del w.triton.refusals[name]
        status, _, _ = await w.embed({"model": "embed", "input": "x"})
        assert status == 200 and w.triton.config_reads[name] == 2
        w.triton.refusals[name] = (500, {"error": "CUDA out of memory"})
        status, answer, _ = await w.embed({"model": "embed", "input": "x"})
        assert status == 500 and answer["error"]["type"] == "server_error"
        assert answer["error"]["message"] == "CUDA out of memory"


@pytest.mark.asyncio
async def test_a_configuration_triton_will_not_give_is_relayed() -> None:
    async with world() as w:
        w.triton.config_status = 500
        status, answer, _ = await w.embed({"model": "embed", "input": "x"})
        assert status == 500 and answer["error"]["code"] == "TritonError"
        assert answer["error"]["message"] == "embed config broke"
        assert w.triton.config_reads[EMBED.triton_name] == 2  # before and after admission
        assert w.triton.infers == []


@pytest.mark.asyncio
async def test_an_answer_that_breaks_the_contract_and_a_wrong_dimensions() -> None:
    async with world() as w:
        w.triton.short_answer = True
        status, answer, _ = await w.embed({"model": "embed", "input": ["a", "b"]})
        assert status == 502 and answer["error"]["code"] == "BadModelAnswer"
        assert "not FP32 of shape [2, width]" in answer["error"]["message"]
        w.triton.short_answer = False
        status, answer, _ = await w.embed({"model": "embed", "input": "a", "dimensions": 8})
        assert status == 400 and answer["error"]["message"].startswith(
            "dimensions: embed answers 3 dimensions"
        )
        status, answer, _ = await w.embed({"model": "embed", "input": "a", "dimensions": WIDTH})
        assert status == 200
        assert_rows(answer, ["a"])


@pytest.mark.asyncio
async def test_queue_limits_and_progress_apply_as_on_the_other_routes() -> None:
    full = route("embed", "team-a", max_queued=0)
    async with world(resident=False, routes=(full,)) as w:
        status, answer, headers = await w.embed({"model": "embed", "input": "x"})
        assert status == 429 and answer["error"]["code"] == "QueueFull"
        assert int(headers["Retry-After"]) >= 1
    async with world(resident=False, progress_interval_seconds=0.01) as w:
        w.directory.hold(EMBED.uid)
        headers = {**HOST_A, "X-Modelswap-Progress": "sse"}
        async with w.http.post(
            w.url("/v1/embeddings"), json={"model": "embed", "input": "zz"}, headers=headers
        ) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/event-stream")
            first = (await r.content.readline()).decode().rstrip("\n")
            assert first == ": swap-in queued position=1"
            w.directory.release(EMBED.uid)
            lines = (await r.text()).split("\n")
        data = [line for line in lines if line.startswith("data: ")]
        assert len(data) == 1
        assert_rows(json.loads(data[0].removeprefix("data: ")), ["zz"])
    slow = route("embed", "team-a", queue_timeout_seconds=0.05)
    async with world(resident=False, routes=(slow,)) as w:
        w.directory.hold(slow.uid)
        status, answer, headers = await w.embed({"model": "embed", "input": "x"})
        assert status == 503 and answer["error"]["code"] == "QueueTimeout"
        assert int(headers["Retry-After"]) >= 1
        w.directory.release(slow.uid)

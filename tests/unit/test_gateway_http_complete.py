"""HTTP completeness over loopback with a fake Triton: every model's statistics
(`/v2/models/stats`, scoped as one model's), `/v2` listing only the extensions the gateway
serves, and answers compressed when the client asks (gzip, deflate), with
`Inference-Header-Content-Length` as Triton sets it."""

from __future__ import annotations

import gzip
import json
import struct
import threading
import zlib
from contextlib import AbstractAsyncContextManager
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from tritonclient.http import InferResult

from modelswap_sidecar.gateway import compression, extensions
from modelswap_sidecar.gateway.paths import Endpoint, PathTable
from tests.support.gateway_fakes import route
from tests.support.gateway_upstream import FakeTriton
from tests.support.gateway_world import GatewayWorld, gateway_world

LLAMA_A = route("llama", "team-a")
LLAMA_B = route("llama", "team-b")
BERT = route("bert", "team-a")
STATS = route("stats", "team-a")  # a model whose name is the path's word
CHAT = route("chat", "team-a", decoupled=True)
ALL = (LLAMA_A, LLAMA_B, BERT, STATS, CHAT)
HOST_A = {"Host": "llama.team-a.svc.cluster.local"}

#: What Triton 2.51 lists in `GET /v2`.
TRITON_EXTENSIONS = [
    "classification", "sequence", "model_repository", "model_repository(unload_dependents)",
    "schedule_policy", "model_configuration", "system_shared_memory", "cuda_shared_memory",
    "binary_tensor_data", "parameters", "statistics", "trace", "logging",
]  # fmt: skip
#: Those the gateway routes, in Triton's order.
SERVED = [
    "classification", "sequence", "schedule_policy", "model_configuration",
    "binary_tensor_data", "parameters", "statistics",
]  # fmt: skip


class Triton(FakeTriton):
    """The fake Triton with Triton's extension list, every model's statistics (a model the
    node did not route among them) and binary tensor answers when an output asks."""

    async def _server_metadata(self, request: web.Request) -> web.Response:
        return web.json_response(
            {"name": "triton", "version": "2.51.0", "extensions": TRITON_EXTENSIONS}
        )

    async def _metadata(self, request: web.Request) -> web.Response:
        if request.match_info["m"] == "stats":  # Triton's own /v2/models/stats
            self.calls.append((request.path, request.headers.get("Host", "")))
            names = sorted(self.loaded | {"m-not-routed"})
            stats = [{"name": n, "version": "1", "inference_count": 3} for n in names]
            return web.json_response({"model_stats": stats})
        return await super()._metadata(request)

    async def _infer(self, request: web.Request) -> web.Response:
        body = await request.json()
        outputs = body.get("outputs") or []
        if not any(o.get("parameters", {}).get("binary_data") for o in outputs):
            return await super()._infer(request)
        name = self._model(request)
        values = [2 * v for v in body["inputs"][0]["data"]]
        data = struct.pack(f"<{len(values)}f", *values)
        output = {"name": "OUTPUT0", "datatype": "FP32", "shape": [len(values)],
                  "parameters": {"binary_data_size": len(data)}}  # fmt: skip
        header = json.dumps(
            {"model_name": name, "model_version": "1", "outputs": [output]},
            separators=(",", ":"),
        ).encode()
        return web.Response(
            body=header + data,
            content_type="application/octet-stream",
            headers={"Inference-Header-Content-Length": str(len(header))},
        )


class World(GatewayWorld):
    async def get(self, path: str, **headers: str) -> tuple[int, Any]:
        async with self.http.get(self.served.url + path, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def raw(
        self, method: str, path: str, headers: dict[str, str], body: Any = None
    ) -> tuple[int, bytes, Any]:
        """The answer's bytes as sent (not inflated)."""
        async with (
            aiohttp.ClientSession(
                auto_decompress=False, skip_auto_headers=("Accept-Encoding",)
            ) as http,
            http.request(method, self.served.url + path, json=body, headers=headers) as r,
        ):
            return r.status, await r.read(), r.headers


def world(*, resident: bool = True, **settings: Any) -> AbstractAsyncContextManager[World]:
    return gateway_world(World, ALL, resident=resident, triton=Triton(), **settings)


def infer_body(values: list[float], *, binary: bool = False) -> dict[str, Any]:
    body: dict[str, Any] = {
        "inputs": [{"name": "INPUT0", "shape": [len(values)], "datatype": "FP32", "data": values}]
    }
    if binary:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]
    return body


def inflate(raw: bytes, coding: str) -> bytes:
    return gzip.decompress(raw) if coding == "gzip" else zlib.decompress(raw)


# -- every model's statistics ----------------------------------------------------------------


@pytest.mark.asyncio
async def test_every_models_statistics_are_the_namespaces_own_named_namespace_slash_name() -> None:
    async with world() as w:
        triton_names = {r.triton_name: f"{r.namespace}/{r.name}" for r in ALL}
        status, body = await w.get("/ns/team-a/v2/models/stats")
        assert status == 200, body
        named = sorted(s["name"] for s in body["model_stats"])
        assert named == ["team-a/bert", "team-a/chat", "team-a/llama", "team-a/stats"]
        assert all(s["inference_count"] == 3 for s in body["model_stats"])
        # the Triton names never show, nor a model the node does not route
        assert all(name not in json.dumps(body) for name in [*triton_names, "m-not-routed"])
        # the namespace from the Host, as for one model's statistics
        status, body = await w.get("/v2/models/stats", Host="llama.team-b.svc")
        assert status == 200 and [s["name"] for s in body["model_stats"]] == ["team-b/llama"]
        # a namespace the node serves nothing in lists nothing
        status, body = await w.get("/ns/team-z/v2/models/stats")
        assert status == 200 and body == {"model_stats": []}
        # no namespace outside local mode: as for one model's
        status, body = await w.get("/v2/models/stats")
        assert status == 400 and body["reason"] == "NamespaceRequired"
        assert w.directory.swap_ins == {}  # nothing woken
        # a model named `stats` keeps its own statistics under /stats/stats
        status, body = await w.get("/ns/team-a/v2/models/stats/stats")
        assert status == 200 and body["model_stats"][0]["name"] == "stats"


@pytest.mark.asyncio
async def test_every_models_statistics_in_local_mode_are_every_namespaces() -> None:
    async with world(local_mode=True) as w:
        status, body = await w.get("/v2/models/stats")
        assert status == 200
        named = sorted(s["name"] for s in body["model_stats"])
        assert named == sorted(f"{r.namespace}/{r.name}" for r in ALL)


@pytest.mark.asyncio
async def test_every_models_statistics_leave_out_what_triton_does_not_hold_and_wake_nothing() -> (
    None
):
    async with world(resident=False) as w:  # every model swapped out, Triton holds none
        w.triton.loaded = {BERT.triton_name}  # but bert (`onSwapOut: host`)
        status, body = await w.get("/ns/team-a/v2/models/stats")
        assert status == 200 and [s["name"] for s in body["model_stats"]] == ["team-a/bert"]
        assert w.directory.swap_ins == {} and w.directory.requests == []


# -- the extensions /v2 lists ------------------------------------------------------------------


def use_url(path: str) -> str:
    return "/ns/team-a" + path.replace(extensions.PLACEHOLDER, "llama")


@pytest.mark.asyncio
async def test_v2_lists_the_extensions_the_gateway_routes_and_each_one_works() -> None:
    async with world() as w:
        status, body = await w.get("/v2")
        assert status == 200
        assert body == {"name": "triton", "version": "2.51.0", "extensions": SERVED}
        for name in SERVED:
            for method, path in extensions.USES[name]:
                payload = infer_body([1.0]) if method == "POST" else None
                async with w.http.request(method, w.served.url + use_url(path), json=payload) as r:
                    assert r.status == 200, (name, path, await r.text())
        for name in set(TRITON_EXTENSIONS) - set(SERVED):
            for method, path in extensions.USES[name]:
                async with w.http.request(method, w.served.url + use_url(path)) as r:
                    assert r.status == 404, (name, path)
                    assert (await r.json())["reason"] == "NotFound"


def test_an_extension_is_listed_only_when_every_use_is_routed_under_its_method() -> None:
    async def handler(call: Any) -> Any:
        raise AssertionError

    paths: PathTable[Any] = PathTable()
    paths.v2_model("/infer", Endpoint("POST", handler, "v2"))
    paths.v2_model("", Endpoint("GET", handler, "v2"))  # /v2/models/stats names a model here
    paths.v2_model("/stats", Endpoint("GET", handler, "v2"))
    paths.v2_model("/config", Endpoint("POST", handler, "v2"))  # another method
    listed = ["parameters", "statistics", "model_configuration", "future_extension", 7, "trace"]
    assert extensions.served(listed, paths) == ["parameters"]
    paths.scoped("/v2/models/stats", Endpoint("GET", handler, "v2"))
    assert extensions.served(listed, paths) == ["parameters", "statistics"]


# -- compression -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("accept", "coding"),
    [
        ("gzip", "gzip"),
        ("deflate", "deflate"),
        ("gzip, deflate", "gzip"),
        ("deflate, gzip", "gzip"),
        ("deflate, gzip;q=0.5", "deflate"),
        ("gzip;q=0", None),
        ("gzip;q=0, deflate", "deflate"),
        ("GZIP", "gzip"),
        ("x-gzip", "gzip"),
        ("*", "gzip"),
        ("*;q=0", None),
        ("br, zstd", None),
        ("br, *;q=0.1", "gzip"),
        ("deflate, *;q=0.5", "deflate"),
        ("identity", None),
        ("gzip;q=abc, deflate;q=0.2", "deflate"),
        ("gzip;q=nan", None),
        ("gzip;q=2", None),
        (" , ;", None),
        ("", None),
    ],
)
def test_the_coding_follows_accept_encoding(accept: str, coding: str | None) -> None:
    assert compression.chosen_coding(accept) == coding


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.asyncio
async def test_a_json_infer_answer_is_compressed_as_asked_with_its_length(coding: str) -> None:
    async with world() as w:
        values = [float(i) for i in range(400)]
        path = "/v2/models/llama/infer"
        status, raw, headers = await w.raw(
            "POST", path, {**HOST_A, "Accept-Encoding": coding}, infer_body(values)
        )
        assert status == 200
        assert headers["Content-Encoding"] == coding and headers["Vary"] == "Accept-Encoding"
        assert int(headers["Content-Length"]) == len(raw)
        answer = json.loads(inflate(raw, coding))
        assert answer["model_name"] == "llama"
        assert answer["outputs"][0]["data"] == [2 * v for v in values]
        assert len(raw) < len(inflate(raw, coding)) // 2
        # not asked, or refused: as it is
        for accept in (None, "identity", f"{coding};q=0", "br"):
            asked = {**HOST_A, **({"Accept-Encoding": accept} if accept else {})}
            status, plain, headers = await w.raw("POST", path, asked, infer_body(values))
            assert status == 200 and "Content-Encoding" not in headers
            assert json.loads(plain) == answer


@pytest.mark.asyncio
async def test_a_small_answer_is_not_compressed() -> None:
    async with world() as w:
        headers = {**HOST_A, "Accept-Encoding": "gzip, deflate"}
        status, raw, answer_headers = await w.raw(
            "POST", "/v2/models/llama/infer", headers, infer_body([1.0, 2.0])
        )
        assert status == 200 and len(raw) < compression.MIN_COMPRESSED_BYTES
        assert "Content-Encoding" not in answer_headers and "Vary" not in answer_headers
        assert json.loads(raw)["outputs"][0]["data"] == [2.0, 4.0]


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
@pytest.mark.asyncio
async def test_a_binary_tensor_answer_keeps_its_uncompressed_header_length(coding: str) -> None:
    async with world() as w:
        values = [float(i) / 4 for i in range(2000)]
        status, raw, headers = await w.raw(
            "POST",
            "/v2/models/llama/infer",
            {**HOST_A, "Accept-Encoding": coding},
            infer_body(values, binary=True),
        )
        assert status == 200 and headers["Content-Encoding"] == coding
        assert int(headers["Content-Length"]) == len(raw)
        plain = inflate(raw, coding)
        header_length = int(headers["Inference-Header-Content-Length"])
        header = json.loads(plain[:header_length])  # the renamed header, before compression
        assert header["model_name"] == "llama"
        assert plain[header_length:] == struct.pack(f"<{len(values)}f", *[2 * v for v in values])
        # as tritonclient reads it
        result = InferResult.from_response_body(raw, False, str(header_length), coding)
        out = result.as_numpy("OUTPUT0")
        assert out is not None and out.tolist() == [2 * v for v in values]


@pytest.mark.asyncio
async def test_documents_are_compressed_and_a_large_answer_in_a_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []
    real = compression.compress

    def recording(body: bytes, coding: str) -> bytes:
        threads.append(threading.current_thread().name)
        return real(body, coding)

    monkeypatch.setattr(compression, "compress", recording)
    async with world() as w:
        w.triton.configs[BERT.triton_name] = {"description": "a long note " * 200}
        gz = {"Accept-Encoding": "gzip"}
        status, raw, headers = await w.raw("GET", "/ns/team-a/v2/models/bert/config", gz)
        assert status == 200 and headers["Content-Encoding"] == "gzip"
        config = json.loads(gzip.decompress(raw))
        assert config["name"] == "bert" and config["description"].startswith("a long note")
        assert "modelswap.agent_socket" not in config["parameters"]
        assert threads == [threading.current_thread().name]  # small: in the event loop
        values = [float(i) for i in range(10_000)]  # about 120 KB of JSON
        status, raw, headers = await w.raw(
            "POST", "/v2/models/llama/infer", {**HOST_A, **gz}, infer_body(values)
        )
        assert status == 200 and len(gzip.decompress(raw)) >= compression.THREAD_BYTES
        assert json.loads(gzip.decompress(raw))["outputs"][0]["data"] == [2 * v for v in values]
        assert threads[-1] != threading.current_thread().name  # large: in a thread


@pytest.mark.asyncio
async def test_openai_answers_are_compressed_and_streams_are_not() -> None:
    async with world() as w:
        prompt = " ".join(f"word{i}" for i in range(300))
        body = {"model": "chat", "prompt": prompt, "max_tokens": 400}
        headers = {**HOST_A, "Accept-Encoding": "gzip, deflate"}
        status, raw, answer_headers = await w.raw("POST", "/v1/completions", headers, body)
        assert status == 200 and answer_headers["Content-Encoding"] == "gzip"
        text = json.loads(gzip.decompress(raw))["choices"][0]["text"]
        assert text == "".join(f" WORD{i}" for i in range(300))
        streamed = {**body, "stream": True}
        status, raw, answer_headers = await w.raw("POST", "/v1/completions", headers, streamed)
        assert status == 200 and "Content-Encoding" not in answer_headers
        assert answer_headers["Content-Type"].startswith("text/event-stream")
        assert raw.rstrip().endswith(b"data: [DONE]") and b"WORD299" in raw

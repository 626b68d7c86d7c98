"""What a v2 request may make Triton allocate, over HTTP on loopback with a fake Triton
(issue 26, items 1 and 10): a request refused for its body is refused before any swap-in
and never reaches Triton; the model's configuration bounds the rest; odd headers and
bodies are 400s, not the gateway's own 500."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import pytest

from modelswap_sidecar.gateway.bodies import read_body
from modelswap_sidecar.gateway.errors import BadRequestError
from tests.support.reliability import record
from tests.unit.test_gateway_tensors import BATCHED_CONFIG
from tests.unit.test_gateway_v2 import BERT, World, infer_body, world

HOST = {"Host": "bert.team-a.svc"}
PATH = "/v2/models/bert/infer"
#: The request that crashed the node's Triton (4 TB for one value).
CRASHER = {
    "inputs": [{"name": "INPUT0", "shape": [1000000, 1000000], "datatype": "FP32", "data": [1]}]
}


async def post_raw(w: World, path: str, data: bytes, headers: dict[str, str]) -> tuple[int, Any]:
    async with w.http.post(w.served.url + path, data=data, headers=headers) as r:
        return r.status, await r.json(content_type=None)


def infers(w: World) -> list[str]:
    return [path for path, _ in w.triton.calls if not path.endswith("/config")]


@pytest.mark.asyncio
async def test_the_crashing_shape_is_a_400_naming_the_input_before_any_swap_in() -> None:
    async with world(resident=False) as w:
        started = time.monotonic()
        for _ in range(3):
            status, body, _ = await w.post(PATH, CRASHER, **HOST)
            assert status == 400 and body["reason"] == "BadRequest"
            assert body["error"].startswith("input 'INPUT0': shape [1000000, 1000000] holds")
        assert not w.directory.swap_ins and w.triton.calls == []
        labels = {"uid": BERT.uid, "namespace": "team-a", "model": "bert"}
        assert w.served.metric("modelswap_gateway_requests_total", **labels, code="400") == 3
    record("inputs", input='gateway v2 infer {"shape": [1000000, 1000000], "data": [1]}',
           limit="each input's shape against the data the body carries",
           outcome=f"400: {body['error'][:100]} (no swap-in, nothing sent to Triton)",
           answered_seconds=round((time.monotonic() - started) / 3, 4))  # fmt: skip


BODIES = [
    pytest.param(PATH, json.dumps(infer_body([1])).encode("utf-16"), "not UTF-8", id="utf-16"),
    pytest.param(PATH, b'{"inputs": [{"name": "INPUT0"', "not JSON", id="malformed"),
    pytest.param(PATH, b"[]", "must be a JSON object", id="not-an-object"),
    pytest.param(PATH, json.dumps({"inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32",
                 "parameters": {"shared_memory_region": "r", "shared_memory_byte_size": 8}}]}
                 ).encode(), "shared memory", id="shared-memory"),
    pytest.param("/v2/models/bert/generate", b"\xff\xfe{", "not UTF-8", id="generate-utf-16"),
    pytest.param("/v2/models/bert/generate_stream", b"{'text_input': 1}", "not JSON",
                 id="generate-stream-malformed"),
]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize(("path", "data", "words"), BODIES)
async def test_odd_bodies_are_a_400_with_a_reason_and_start_no_swap_in(
    path: str, data: bytes, words: str
) -> None:
    """Triton answered these 500 (its JSON parser's message), after a swap-in."""
    async with world(resident=False) as w:
        started = time.monotonic()
        status, body = await post_raw(w, path, data, {**HOST, "Content-Type": "application/json"})
        seconds = time.monotonic() - started
        assert status == 400 and words in body["error"], body
        assert not w.directory.swap_ins and w.triton.calls == []
    record("inputs", input=f"gateway {path}: {data[:32]!r}",
           limit="a v2 body is a JSON object whose inputs' data is all in it; no shared memory",
           outcome=f"{status}: {body['error'][:80]} (no swap-in, nothing sent to Triton)",
           answered_seconds=round(seconds, 3))  # fmt: skip


@pytest.mark.asyncio
async def test_the_model_configuration_bounds_batch_and_dims_before_triton() -> None:
    async with world() as w:
        w.triton.configs[BERT.triton_name] = BATCHED_CONFIG
        too_big = {"inputs": [{"name": "INPUT0", "shape": [5, 2, 3], "datatype": "FP32",
                               "data": [0] * 30}]}  # fmt: skip
        status, body, _ = await w.post(PATH, too_big, **HOST)
        assert status == 400
        assert body["error"] == (
            "input 'INPUT0': shape [5, 2, 3] has a batch of 5; bert takes at most 4 "
            "(shape [batch, *[2, 3]])"
        )
        wrong = {"inputs": [{"name": "INPUT0", "shape": [1, 3, 2], "datatype": "FP32",
                             "data": [0] * 6}]}  # fmt: skip
        status, body, _ = await w.post(PATH, wrong, **HOST)
        assert status == 400 and "does not fit bert's dims [-1, 2, 3]" in body["error"]
        assert infers(w) == []  # neither reached Triton
        largest = {"inputs": [{"name": "INPUT0", "shape": [4, 2, 3], "datatype": "FP32",
                               "data": list(range(24))}]}  # fmt: skip
        status, body, _ = await w.post(PATH, largest, **HOST)
        assert status == 200 and body["outputs"][0]["data"] == [2 * v for v in range(24)]
        # the configuration was read once, and is not read per request
        configs = [p for p, _ in w.triton.calls if p.endswith("/config")]
        assert len(configs) == 1


@pytest.mark.asyncio
async def test_a_known_configuration_refuses_before_a_swap_in_an_unknown_one_after() -> None:
    """A dropped model's configuration is Triton's only: the request is admitted (the model
    swapped in) before it can be checked; once known, a refusal starts no swap-in."""
    async with world(resident=False) as w:
        w.triton.configs[BERT.triton_name] = BATCHED_CONFIG
        too_big = {"inputs": [{"name": "INPUT0", "shape": [5, 2, 3], "datatype": "FP32",
                               "data": [0] * 30}]}  # fmt: skip
        status, body, _ = await w.post(PATH, too_big, **HOST)
        assert status == 400 and "at most 4" in body["error"]
        assert w.directory.swap_ins[BERT.uid] == 1 and infers(w) == []
        w.directory.resident.discard(BERT.uid)  # swapped out again (dropped)
        w.triton.loaded.discard(BERT.triton_name)
        status, body, _ = await w.post(PATH, too_big, **HOST)
        assert status == 400 and w.directory.swap_ins[BERT.uid] == 1


HEADERS = [
    pytest.param(b"Content-Type: application/json; charset=\xe2\x82\xac\r\n", "Latin-1",
                 id="content-type-euro"),
    pytest.param(b"Inference-Header-Content-Length: \xc2\xb2\r\n", "not a decimal number",
                 id="header-length-superscript-two"),
    pytest.param(b"Inference-Header-Content-Length: 99999\r\n", "exceeds the body",
                 id="header-length-past-the-body"),
]  # fmt: skip


@pytest.mark.asyncio
@pytest.mark.parametrize(("header", "words"), HEADERS)
async def test_odd_header_values_are_a_400_not_the_gateways_500(header: bytes, words: str) -> None:
    """`²` is a digit to Python's isdigit and no number to int: both were 500s."""
    async with world() as w:
        data = json.dumps(infer_body([1])).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", w.served.url.split(":")[-1])
        started = time.monotonic()
        writer.write(b"POST /v2/models/bert/infer HTTP/1.1\r\nHost: bert.team-a.svc\r\n")
        writer.write(header + b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(data))
        writer.write(data)
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        seconds = time.monotonic() - started
        writer.close()
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 400 "), answer
        assert words in json.loads(body)["error"]
        assert infers(w) == []
    record("inputs", input=f"gateway header {header.strip()[:48]!r}",
           limit="forwarded header values in Latin-1; header length ASCII digits",
           outcome=f"400: {json.loads(body)['error'][:80]}",
           answered_seconds=round(seconds, 3))  # fmt: skip


class _BrokenContent:
    """A body the server's parser gave up on partway (aiohttp's pure-Python parser does so
    for a chunk extension past its 8,190-byte line limit)."""

    def is_eof(self) -> bool:
        return False

    async def iter_any(self) -> Any:
        from aiohttp.web_protocol import RequestPayloadError

        yield b"{"
        error = RequestPayloadError("Response payload is not completed")
        error.__cause__ = ValueError("400, message:\n  Got more than 8190 bytes when reading")
        raise error


class _Request:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.content_length = None
        self.content = _BrokenContent()


@pytest.mark.asyncio
async def test_a_body_the_parser_gave_up_on_is_a_400() -> None:
    with pytest.raises(BadRequestError, match="could not be read: 400, message:   Got more"):
        await read_body(_Request(), max_bytes=1 << 20, timeout_seconds=5)  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_a_9kb_chunk_extension_is_never_a_500() -> None:
    async with world() as w:
        data = json.dumps(infer_body([1])).encode()
        reader, writer = await asyncio.open_connection("127.0.0.1", w.served.url.split(":")[-1])
        writer.write(b"POST /v2/models/bert/infer HTTP/1.1\r\nHost: bert.team-a.svc\r\n"
                     b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n")  # fmt: skip
        writer.write(b"%x;%s\r\n%s\r\n0\r\n\r\n" % (len(data), b"x" * 9000, data))
        await writer.drain()
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
    # aiohttp's C parser skips the extension (200); its Python parser refuses it (400)
    assert answer.startswith((b"HTTP/1.1 200 ", b"HTTP/1.1 400 ")), answer[:200]


@pytest.mark.asyncio
async def test_a_request_triton_dropped_is_logged_and_counted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with world() as w:
        w.triton.drop_infers = True
        status, body, _ = await w.post(PATH, infer_body([1]), **HOST)
        assert status == 503 and body["reason"] == "UpstreamUnavailable"
        labels = {"uid": BERT.uid, "namespace": "team-a", "model": "bert"}
        assert w.served.metric("modelswap_gateway_upstream_lost_total", **labels) == 1
        assert "if Triton crashed, this request may be why" in caplog.text
        assert "team-a/bert" in caplog.text
        w.triton.drop_infers = False
        status, _, _ = await w.post(PATH, infer_body([1]), **HOST)
        assert status == 200
        assert w.served.metric("modelswap_gateway_upstream_lost_total", **labels) == 1


@pytest.mark.asyncio
async def test_generate_bodies_triton_would_fail_on_are_a_400_before_triton() -> None:
    """Triton answered these with its own 500 (the fuzz run found them): a field naming a
    string input holding no string, `parameters` null, a non-string `id`."""
    async with world() as w:
        w.triton.configs[BERT.triton_name] = BATCHED_CONFIG  # LABEL: TYPE_STRING
        headers = {"Content-Type": "application/json", **HOST}
        for path in ("/v2/models/bert/generate", "/v2/models/bert/generate_stream"):
            for raw, words in [
                (b'{"LABEL": true}', "'LABEL' (bert's input): data holds true; BYTES data"),
                (b'{"LABEL": ["a", [5]]}', "data holds 5; BYTES data must be strings"),
                (b'{"text_input": "a", "parameters": null}', "parameters must be an object"),
                (b'{"text_input": "a", "id": 7}', "id: must be a string"),
            ]:
                status, body = await post_raw(w, path, raw, headers)
                assert status == 400 and words in body["error"], (path, raw, body)
        assert infers(w) == []

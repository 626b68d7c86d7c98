"""The gateway's HTTP completeness against a real Triton, with the official client
`tritonclient.http` (sync and asyncio): the compression matrix (requests and answers in
gzip, deflate or neither, JSON and binary tensors), every answer checked; raw `httpx` for
`Accept-Encoding`; every model's statistics; `/v2` listing only what the gateway serves;
`Inference-Header-Content-Length` of a compressed binary answer counted as Triton counts it.
"""

from __future__ import annotations

import asyncio
import gzip
import itertools
import json
import zlib
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as triton_sync
import tritonclient.http.aio as triton_aio

from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton

CODINGS = (None, "gzip", "deflate")
#: 2,000 FP32 values: answers of 8 KB (binary) and 20 KB (JSON), past the compression floor
VALUES = np.arange(2000, dtype=np.float32) / 8


def inputs(module: object, values: np.ndarray, *, binary: bool) -> list[object]:
    tensor = module.InferInput("INPUT0", list(values.shape), "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(values, binary_data=binary)
    return [tensor]


def outputs(module: object, *, binary: bool) -> list[object]:
    return [
        module.InferRequestedOutput(name, binary_data=binary)  # type: ignore[attr-defined]
        for name in ("OUTPUT0", "UID")
    ]


def check(result: object, uid: str, values: np.ndarray) -> None:
    out = result.as_numpy("OUTPUT0")  # type: ignore[attr-defined]
    got_uid = result.as_numpy("UID")  # type: ignore[attr-defined]
    assert out is not None and got_uid is not None
    np.testing.assert_array_equal(out, values * 2)
    answered = got_uid[0]
    assert (answered.decode() if isinstance(answered, bytes) else answered) == uid


def sync_matrix(url: str, uid: str) -> int:
    """Every combination through the sync client (geventhttpclient); the number checked."""
    client = triton_sync.InferenceServerClient(url)
    try:
        checked = 0
        for request_coding, response_coding, binary in itertools.product(
            CODINGS, CODINGS, (False, True)
        ):
            result = client.infer(
                "plain",
                inputs(triton_sync, VALUES + checked, binary=binary),
                outputs=outputs(triton_sync, binary=binary),
                request_compression_algorithm=request_coding,
                response_compression_algorithm=response_coding,
            )
            check(result, uid, VALUES + checked)
            checked += 1
        return checked
    finally:
        client.close()


@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_tritonclient_http_compression_matrix_statistics_and_extensions(
    tmp_path: Path,
) -> None:
    plain = route("plain", "team-a")
    async with gateway_over_triton(tmp_path, [Served(plain, "plain")], local_mode=True) as g:
        url = g.served.url.removeprefix("http://")
        client = triton_aio.InferenceServerClient(url)
        try:
            # the asyncio client, every combination (the first request swaps plain in)
            checked = 0
            for request_coding, response_coding, binary in itertools.product(
                CODINGS, CODINGS, (False, True)
            ):
                values = VALUES - checked
                result = await client.infer(
                    "plain",
                    inputs(triton_aio, values, binary=binary),
                    outputs=outputs(triton_aio, binary=binary),
                    request_compression_algorithm=request_coding,
                    response_compression_algorithm=response_coding,
                )
                check(result, plain.uid, values)
                checked += 1
            assert checked == 18 and g.directory.swap_ins[plain.uid] == 1
            # the sync client, every combination
            assert await asyncio.to_thread(sync_matrix, url, plain.uid) == 18

            # every model's statistics, named namespace/name, through the official client
            stats = await client.get_inference_statistics()
            assert [s["name"] for s in stats["model_stats"]] == ["team-a/plain"]
            assert stats["model_stats"][0]["inference_stats"]["success"]["count"] == 36
            one = await client.get_inference_statistics("plain")
            assert one["model_stats"][0]["name"] == "plain"

            # /v2 lists Triton's extensions less those the gateway refuses
            gateway_metadata = await client.get_server_metadata()
            triton_metadata = await g.triton.client.get_server_metadata()
            assert "system_shared_memory" in triton_metadata["extensions"]
            assert gateway_metadata["extensions"] == [
                name
                for name in triton_metadata["extensions"]
                if name
                in {
                    "classification", "sequence", "schedule_policy", "model_configuration",
                    "binary_tensor_data", "parameters", "statistics",
                }
            ]  # fmt: skip
            assert gateway_metadata["version"] == triton_metadata["version"]
            # listed extensions carried by an inference's parameters work through the gateway:
            # classification (the top 2 of OUTPUT0), schedule_policy (priority, timeout),
            # parameters (a custom one)
            values = np.array([0.5, 3.0, 1.0], dtype=np.float32)
            result = await client.infer(
                "plain",
                inputs(triton_aio, values, binary=False),
                outputs=[triton_aio.InferRequestedOutput("OUTPUT0", class_count=2)],
                priority=1,
                timeout=10_000_000,
                parameters={"note": "kept"},
                response_compression_algorithm="gzip",
            )
            top = result.as_numpy("OUTPUT0")
            assert top is not None and [t.decode() for t in top] == ["6.000000:1", "2.000000:2"]
        finally:
            await client.close()

        # raw HTTP: Accept-Encoding as httpx sends it, and Triton's own header length
        body = {
            "inputs": [
                {"name": "INPUT0", "shape": [2000], "datatype": "FP32", "data": VALUES.tolist()}
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
        async with httpx.AsyncClient(base_url=g.served.url) as http:
            answer = await http.post("/v2/models/plain/infer", json=body)  # gzip, deflate, ...
            assert answer.status_code == 200 and answer.headers["content-encoding"] == "gzip"
            assert int(answer.headers["content-length"]) < len(answer.content)  # inflated
            length = int(answer.headers["inference-header-content-length"])
            header = json.loads(answer.content[:length])
            assert header["model_name"] == "plain"
            data = np.frombuffer(answer.content[length:], dtype=np.float32)
            np.testing.assert_array_equal(data, VALUES * 2)
            for coding, inflate in (("gzip", gzip.decompress), ("deflate", zlib.decompress)):
                triton_url = "http://" + g.triton.process.http_url.removeprefix("http://")
                for base, path in (
                    (g.served.url, "/v2/models/plain/infer"),
                    (triton_url, f"/v2/models/{plain.triton_name}/infer"),
                ):
                    # the body as sent (httpx would inflate it): Triton and the gateway alike
                    request = http.build_request(
                        "POST", base + path, json=body, headers={"Accept-Encoding": coding}
                    )
                    sent = await http.send(request, stream=True)
                    try:
                        raw = b"".join([chunk async for chunk in sent.aiter_raw()])
                    finally:
                        await sent.aclose()
                    assert sent.headers["content-encoding"] == coding
                    assert int(sent.headers["content-length"]) == len(raw)
                    plain_body = inflate(raw)
                    length = int(sent.headers["inference-header-content-length"])
                    assert json.loads(plain_body[:length])["outputs"][0]["name"] == "OUTPUT0"
                    assert len(plain_body) - length == VALUES.nbytes

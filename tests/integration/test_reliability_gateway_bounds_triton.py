"""The gateway's bounds on v2 inference requests in front of a real Triton (issue 26, items
1 and 10), with the toy models `plain` (max_batch_size 0, INPUT0 dims [-1]) and `batched`
(max_batch_size 4, INPUT0 dims [2, 3], LABEL strings) from tests/data/gateway_models.

`{"shape": [1000000, 1000000], "data": [1]}` sent straight to Triton makes it allocate
4 TB and abort (`std::bad_alloc`), every model with it; through the gateway it is a 400
naming the input, 100 times over, while the other model answers correctly throughout and
Triton's process stays the same one. A legal request at `max_batch_size` with the largest
shapes the configuration allows still answers correctly, as JSON and as binary tensors.
"""

from __future__ import annotations

import asyncio
import json
import struct
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton
from tests.support.reliability import record

PLAIN = route("plain", "team-a")
BATCHED = route("batched", "team-a")
CRASHER = {
    "inputs": [{"name": "INPUT0", "shape": [1000000, 1000000], "datatype": "FP32", "data": [1]}]
}
#: The largest request batched's configuration allows: a batch of max_batch_size (4) rows
#: of [2, 3], and a LABEL of 4 x 3 strings.
VALUES = [float(v) - 11.5 for v in range(24)]
LABELS = ["a", "é", "\u2603"] * 4


def largest_json() -> dict[str, Any]:
    return {
        "inputs": [
            {"name": "INPUT0", "shape": [4, 2, 3], "datatype": "FP32", "data": VALUES},
            {"name": "LABEL", "shape": [4, 3], "datatype": "BYTES", "data": LABELS},
        ]
    }


def largest_binary() -> tuple[bytes, dict[str, str]]:
    floats = struct.pack("<24f", *VALUES)
    strings = b"".join(struct.pack("<I", len(s.encode())) + s.encode() for s in LABELS)
    header = json.dumps(
        {
            "inputs": [
                {"name": "INPUT0", "shape": [4, 2, 3], "datatype": "FP32",
                 "parameters": {"binary_data_size": len(floats)}},
                {"name": "LABEL", "shape": [4, 3], "datatype": "BYTES",
                 "parameters": {"binary_data_size": len(strings)}},
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"binary_data": True}},
                {"name": "LABEL_OUT", "parameters": {"binary_data": False}},
            ],
        }
    ).encode()  # fmt: skip
    headers = {
        "Content-Type": "application/octet-stream",
        "Inference-Header-Content-Length": str(len(header)),
    }
    return header + floats + strings, headers


def assert_largest_answer(body: dict[str, Any]) -> None:
    outputs = {o["name"]: o for o in body["outputs"]}
    assert outputs["OUTPUT0"]["shape"] == [4, 2, 3]
    assert outputs["OUTPUT0"]["data"] == [2 * v for v in VALUES]
    assert outputs["LABEL_OUT"]["shape"] == [4, 3] and outputs["LABEL_OUT"]["data"] == LABELS


async def post(
    http: aiohttp.ClientSession, url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    async with http.post(url, json=body, headers=headers) as r:
        return r.status, await r.json(content_type=None)


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_the_crashing_request_100_times_is_a_400_and_triton_stays_up(tmp_path: Path) -> None:
    served = [Served(PLAIN, "plain"), Served(BATCHED, "batched")]
    async with gateway_over_triton(tmp_path, served) as g, aiohttp.ClientSession() as http:
        base = g.served.url + "/ns/team-a/v2/models"
        pid = g.triton.process.pid
        status, body = await post(http, f"{base}/plain/infer", {
            "inputs": [{"name": "INPUT0", "shape": [2], "datatype": "FP32", "data": [1, 2]}]})  # fmt: skip
        assert status == 200 and body["outputs"][0]["data"] == [2, 4]
        status, body = await post(http, f"{base}/batched/infer", largest_json())
        assert status == 200, body
        assert_largest_answer(body)

        answered: list[float] = []
        stop = asyncio.Event()

        async def the_other_model_answers() -> None:
            while not stop.is_set():
                started = time.monotonic()
                code, answer = await post(http, f"{base}/batched/infer", largest_json())
                assert code == 200, answer
                assert_largest_answer(answer)
                answered.append(time.monotonic() - started)

        probe = asyncio.create_task(the_other_model_answers())
        started = time.monotonic()
        for _ in range(100):
            status, body = await post(http, f"{base}/plain/infer", CRASHER)
            assert status == 400, body
            assert body["error"].startswith("input 'INPUT0': shape [1000000, 1000000] holds")
        seconds = time.monotonic() - started
        stop.set()
        await asyncio.wait_for(probe, 30)
        assert answered, "the other model answered while the crashing requests were refused"
        # the same Triton, still serving plain
        assert g.triton.process.returncode() is None and g.triton.process.pid == pid
        status, body = await post(http, f"{base}/plain/infer", {
            "inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [4]}]})  # fmt: skip
        assert status == 200 and body["outputs"][0]["data"] == [8]
        assert "bad_alloc" not in (tmp_path / "triton.log").read_text()
    record(
        "inputs",
        input='gateway v2 infer {"shape": [1000000, 1000000], "data": [1]} x100',
        limit="each input's shape against the data the body carries",
        outcome=f"100 x 400, Triton pid unchanged, batched answered {len(answered)} times",
        answered_seconds=round(seconds / 100, 4),
    )


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.asyncio
async def test_the_configuration_bounds_and_the_largest_legal_request(tmp_path: Path) -> None:
    async with (
        gateway_over_triton(tmp_path, [Served(BATCHED, "batched")]) as g,
        aiohttp.ClientSession() as http,
    ):
        url = g.served.url + "/ns/team-a/v2/models/batched/infer"
        # The largest the configuration allows answers correctly, as JSON and binary.
        status, body = await post(http, url, largest_json())
        assert status == 200, body
        assert_largest_answer(body)
        data, headers = largest_binary()
        async with http.post(url, data=data, headers=headers) as r:
            assert r.status == 200, await r.text()
            raw = await r.read()
            length = int(r.headers["Inference-Header-Content-Length"])
        answer = json.loads(raw[:length])
        outputs = {o["name"]: o for o in answer["outputs"]}
        assert outputs["OUTPUT0"]["shape"] == [4, 2, 3]
        assert answer["model_name"] == "batched" and outputs["LABEL_OUT"]["data"] == LABELS
        floats = raw[length : length + outputs["OUTPUT0"]["parameters"]["binary_data_size"]]
        assert list(struct.unpack("<24f", floats)) == [2 * v for v in VALUES]
        # One row more than max_batch_size, or another row shape: the gateway's 400.
        too_big = largest_json()
        too_big["inputs"] = [{"name": "INPUT0", "shape": [5, 2, 3], "datatype": "FP32",
                              "data": [0.0] * 30}]  # fmt: skip
        status, body = await post(http, url, too_big)
        assert status == 400 and body["error"] == (
            "input 'INPUT0': shape [5, 2, 3] has a batch of 5; batched takes at most 4 "
            "(shape [batch, *[2, 3]])"
        )
        # Binary data shorter than its shape, and shared memory: 400s, Triton untouched.
        header = json.dumps({"inputs": [{"name": "INPUT0", "shape": [1 << 20, 2, 3],
                                         "datatype": "FP32",
                                         "parameters": {"binary_data_size": 24}}]}).encode()  # fmt: skip
        async with http.post(
            url,
            data=header + b"\0" * 24,
            headers={"Inference-Header-Content-Length": str(len(header))},
        ) as r:
            assert r.status == 400 and "binary_data_size is 24" in (await r.json())["error"]
        shm = {"inputs": [{"name": "INPUT0", "shape": [1, 2, 3], "datatype": "FP32",
                           "parameters": {"shared_memory_region": "any",
                                          "shared_memory_byte_size": 24}}]}  # fmt: skip
        status, body = await post(http, url, shm)
        assert status == 400 and "shared memory" in body["error"]
        # A model that raises: Triton's 500, without the stub's traceback or the path of
        # the model's file on the node.
        failing = largest_json()
        failing["inputs"][1] = {"name": "LABEL", "shape": [4, 1], "datatype": "BYTES",
                                "data": ["raise"] * 4}  # fmt: skip
        status, body = await post(http, url, failing)
        assert status == 500
        assert "the batched toy was asked to fail" in body["error"]
        assert "At:" not in body["error"] and str(tmp_path) not in body["error"]
        assert "/repository/" not in body["error"] and "model.py(" not in body["error"]
        assert g.triton.process.returncode() is None
        status, body = await post(http, url, largest_json())
        assert status == 200

"""`POST /v1/embeddings` through the gateway in front of a real Triton (CPU, from `make
setup`), with the toy embedding model `tests/data/gateway_models/hashembed`: a model's
swap-in is its real load into Triton (held until the test releases it), its swap-out a
real unload, so an answer equal to the toy's own values proves the whole way there and
back, the strings' bytes included."""

from __future__ import annotations

import asyncio
import base64
import hashlib
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest

from tests.support.gateway_fakes import route
from tests.support.gateway_triton import Served, gateway_over_triton
from tests.support.waiting import until

HOST = {"Host": "hashembed.team-a.svc.cluster.local:8080"}
URL_PATH = "/v1/embeddings"
WIDTH = 16
TEXTS = [
    "hello",
    "é😀 ünïcödé",
    'quotes " and \\ backslashes',
    "a NUL \x00 inside",
    "line\nbreaks\r\nand\ttabs",
    "x" * 5000,
]


def toy_row(text: str) -> np.ndarray:
    """What the toy model computes for `text` (see its model.py), done here in numpy too."""
    raw = np.frombuffer(hashlib.sha256(text.encode()).digest()[:WIDTH], dtype=np.uint8)
    centred = raw.astype(np.float32) - np.float32(127.5)
    return centred / np.linalg.norm(centred)


def assert_toy_answer(answer: Any, texts: list[str], model: str = "hashembed") -> None:
    assert answer["object"] == "list" and answer["model"] == model
    assert [entry["index"] for entry in answer["data"]] == list(range(len(texts)))
    for entry, text in zip(answer["data"], texts, strict=True):
        assert entry["object"] == "embedding"
        embedding = entry["embedding"]
        if isinstance(embedding, str):
            row = np.frombuffer(base64.b64decode(embedding), dtype="<f4")
        else:
            row = np.array(embedding, dtype=np.float64)
            # Each number is the float32's exact value: nothing was lost on the way.
            assert np.array_equal(row.astype(np.float32).astype(np.float64), row)
        assert np.array_equal(row.astype(np.float32), toy_row(text)), text
    tokens = sum(len(t.encode()) for t in texts)  # the toy counts UTF-8 bytes
    assert answer["usage"] == {"prompt_tokens": tokens, "total_tokens": tokens}


async def embed(
    http: aiohttp.ClientSession, base_url: str, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    async with http.post(
        base_url + URL_PATH, json=body, headers=HOST if headers is None else headers
    ) as r:
        return r.status, await r.json(content_type=None), dict(r.headers)


@pytest.mark.timeout(90)
@pytest.mark.asyncio
async def test_embeddings_swap_the_model_in_and_answer_the_toys_values(tmp_path: Path) -> None:
    model = route("hashembed", "team-a")
    async with (
        gateway_over_triton(tmp_path, [Served(model, "hashembed")]) as g,
        aiohttp.ClientSession() as http,
    ):
        url = g.served.url
        g.directory.hold(model.uid)
        requests: list[dict[str, Any]] = [
            {"model": "hashembed", "input": TEXTS},
            {"model": "hashembed", "input": TEXTS, "encoding_format": "base64"},
            {"model": "team-a/hashembed", "input": "one string", "dimensions": WIDTH},
        ] * 4
        tasks = [asyncio.create_task(embed(http, url, body)) for body in requests]
        await until(
            lambda: g.served.gateway.queues.depth(model.uid) == len(requests), "all queued", 30
        )
        g.directory.release(model.uid)  # now the real load into Triton
        results = await asyncio.wait_for(asyncio.gather(*tasks), 60)
        for body, (status, answer, _) in zip(requests, results, strict=True):
            assert status == 200, answer
            texts = body["input"] if isinstance(body["input"], list) else [body["input"]]
            assert_toy_answer(answer, texts, body["model"])
        assert g.directory.swap_ins[model.uid] == 1
        labels = {"uid": model.uid, "namespace": "team-a", "model": "hashembed"}
        assert g.served.metric("modelswap_gateway_swap_ins_triggered_total", **labels) == 1
        assert g.served.metric("modelswap_gateway_requests_total", **labels, code="200") == 12

        # OpenAI's own cap, 2,048 strings, in one request.
        many = [f"string number {i}" for i in range(2048)]
        status, answer, _ = await embed(http, url, {"model": "hashembed", "input": many})
        assert status == 200
        assert_toy_answer(answer, many)

        # A real swap-out (unloaded from Triton): the next request swaps it in again.
        await g.triton.driver.unload(model.uid)
        g.directory.swap_out(model.uid)
        status, answer, _ = await embed(
            http, url, {"model": "hashembed", "input": ["back"], "encoding_format": "base64"}
        )
        assert status == 200 and g.directory.swap_ins[model.uid] == 2
        assert_toy_answer(answer, ["back"])

        # Listed with the other models.
        async with http.get(url + "/v1/models", headers=HOST) as r:
            assert [m["id"] for m in (await r.json())["data"]] == ["hashembed"]


@pytest.mark.timeout(90)
@pytest.mark.asyncio
async def test_embeddings_errors_from_real_models(tmp_path: Path) -> None:
    embedder = route("hashembed", "team-a")
    plain = route("plain", "team-a")
    tokens = route("tokens", "team-a", decoupled=True)
    models = [Served(embedder, "hashembed"), Served(plain, "plain"), Served(tokens, "tokens")]
    async with gateway_over_triton(tmp_path, models) as g, aiohttp.ClientSession() as http:
        url = g.served.url
        # The model's own error, relayed (a 500 from Triton), under the user's name.
        status, answer, _ = await embed(http, url, {"model": "hashembed", "input": ["a", "raise"]})
        assert status == 500 and answer["error"]["code"] == "TritonError"
        assert answer["error"]["message"] == "the toy embedding was asked to fail"
        # It still serves: the refusal made the gateway read its configuration again.
        status, answer, _ = await embed(http, url, {"model": "hashembed", "input": "a"})
        assert status == 200
        assert_toy_answer(answer, ["a"])
        status, answer, _ = await embed(
            http, url, {"model": "hashembed", "input": "a", "dimensions": 8}
        )
        assert status == 400 and answer["error"]["message"].startswith(
            "dimensions: hashembed answers 16 dimensions"
        )
        for body, start in [
            ({"model": "hashembed", "input": [3, 4]}, "input: token ids"),
            ({"model": "hashembed", "input": [""]}, "input[0]: must not be an empty string"),
            ({"model": "hashembed", "input": ["x"] * 2049}, "input: at most 2048"),
        ]:
            status, answer, _ = await embed(http, url, body)
            assert status == 400 and answer["error"]["message"].startswith(start), answer

        # A model without the contract: its real configuration read from Triton.
        status, answer, _ = await embed(http, url, {"model": "plain", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "NotAnEmbeddingModel"
        message = answer["error"]["message"]
        assert message.startswith("plain does not serve embeddings: no input text_input")
        assert "input INPUT0 is required" in message and plain.triton_name not in message
        # Held by Triton now (as after a swap-out with onSwapOut: host): no swap-in needed.
        g.directory.swap_out(plain.uid)
        status, answer, _ = await embed(http, url, {"model": "plain", "input": "x"})
        assert status == 400 and g.directory.swap_ins[plain.uid] == 1

        # A decoupled model is refused before it is loaded at all.
        status, answer, _ = await embed(http, url, {"model": "tokens", "input": "x"})
        assert status == 400 and answer["error"]["code"] == "NotAnEmbeddingModel"
        assert g.directory.swap_ins[tokens.uid] == 0

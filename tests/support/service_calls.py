"""Requests to a model the way a cluster client sends them: to the address and port its
EndpointSlice gives, with its Service's DNS name as the Host, answers checked against the
reference implementations in examples/models/reference.py."""

from __future__ import annotations

from typing import Any

import httpx
import numpy as np

from examples.models import reference


def slice_address(endpoint_slice: Any) -> tuple[str, int]:
    """(address, port) of an EndpointSlice's first endpoint (the hosting node's gateway)."""
    return str(endpoint_slice.endpoints[0].addresses[0]), int(endpoint_slice.ports[0].port)


async def mlp_answers(address: str, port: int, host: str, model: str) -> None:
    """An MLP inference through the gateway at `address:port`, sent to Service `host`."""
    x = np.arange(16, dtype=np.float32).reshape(1, 16)
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        response = await http.post(
            f"http://{address}:{port}/v2/models/{model}/infer",
            json=reference.mlp_infer_body(x),
            headers={"Host": host},
        )
    assert response.status_code == 200, response.text
    output = next(o for o in response.json()["outputs"] if o["name"] == "OUTPUT0")
    expected = reference.mlp_forward(x)
    assert np.allclose(np.array(output["data"]).reshape(expected.shape), expected, atol=1e-4)


async def tinylm_completes(address: str, port: int, host: str, model: str) -> None:
    """An OpenAI completion from a tinylm model, as the reference spells it."""
    async with httpx.AsyncClient(timeout=60, trust_env=False) as http:
        response = await http.post(
            f"http://{address}:{port}/v1/completions",
            json={"model": model, "prompt": "hello", "max_tokens": 5},
            headers={"Host": host},
        )
    assert response.status_code == 200, response.text
    assert response.json()["choices"][0]["text"] == reference.tinylm_complete("hello", 5)

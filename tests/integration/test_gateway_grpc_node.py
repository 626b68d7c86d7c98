"""The gateway's gRPC front on a real node (`modelswap sidecar` over Triton, the mlp
example): a 100-request burst through `tritonclient.grpc.aio` at a model the control API
swapped out gets exactly one swap-in (the agent's own metrics), and every answer is the
reference's; the gRPC port is in the agent's endpoints file."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc.aio as grpcaio
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from modelswap_sidecar.triton.process import free_loopback_port
from tests.support.agent_harness import MIB, AgentConfig, entry, new_uid, node
from tests.support.bursts import Expected, Reference, small_mlp_models

WEIGHTS_BYTES = 2 * MIB
BURST = 100


def sample(metrics_text: str, name: str, **labels: str) -> float:
    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def problem(reference: Reference, seed: int, expected: Expected, result: object) -> str | None:
    """None when `result` (a tritonclient InferResult) is the right answer for `seed`."""
    response = result.get_response()  # type: ignore[attr-defined]
    if response.model_name != expected.name:
        return f"answered as {response.model_name!r}"
    got = result.as_numpy("OUTPUT0").astype(np.float64).reshape(1, -1)  # type: ignore[attr-defined]
    checksum = int(result.as_numpy("CHECKSUM").reshape(-1)[0])  # type: ignore[attr-defined]
    if not np.allclose(got, reference.outputs[seed], rtol=1e-4, atol=1e-4):
        return f"OUTPUT0 {got.tolist()} != {reference.outputs[seed].tolist()}"
    if checksum != expected.checksum:
        return f"CHECKSUM {checksum} != {expected.checksum}"
    return None


@pytest.mark.slow
@pytest.mark.asyncio
@pytest.mark.timeout(300)
async def test_grpc_burst_of_100_at_a_swapped_out_model_on_a_real_node(tmp_path: Path) -> None:
    grpc_port = free_loopback_port()
    config = AgentConfig(
        gpu_bytes=(4 * WEIGHTS_BYTES,),
        local_mode=False,
        extra={
            "gateway": {"host": "127.0.0.1", "port": free_loopback_port(), "grpcPort": grpc_port},
            "modelRoots": {"/models": str(small_mlp_models(tmp_path, WEIGHTS_BYTES))},
        },
    )
    uid = new_uid()
    wire = entry(
        uid,
        name="mlp-grpc",
        namespace="team-a",
        weights=f"{WEIGHTS_BYTES // MIB}Mi",
        swap_policy={"idleAfter": "never", "minResident": "1s", "onSwapOut": "host"},
    )
    reference = Reference()
    expected = Expected("mlp-grpc", reference.checksum(WEIGHTS_BYTES))
    async with node(tmp_path, config) as n, httpx.AsyncClient(trust_env=False) as http:
        _triton, agent, control, _models = n.parts()
        endpoints = json.loads((agent.state_dir / "agent.json").read_text())
        assert endpoints["gatewayGrpcPort"] == grpc_port
        await control.desired([wire])
        await control.wait_state(uid, "Resident", timeout_seconds=120)
        out = await control.swap(uid, "out")
        assert out.json()["outcome"] == "completed", out.text
        metrics_url = f"http://127.0.0.1:{agent.metrics_port}/metrics"
        swap_ins = "modelswap_gateway_swap_ins_triggered_total"
        before = sample((await http.get(metrics_url)).text, swap_ins, uid=uid)

        client = grpcaio.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        try:
            seeds = [i % len(reference.inputs) for i in range(BURST)]

            async def one(seed: int) -> object:
                x = reference.inputs[seed]
                tensor = grpcaio.InferInput("INPUT0", list(x.shape), "FP32")
                tensor.set_data_from_numpy(x)
                return await client.infer("team-a/mlp-grpc", [tensor], client_timeout=60)

            results = await asyncio.gather(*(one(seed) for seed in seeds))
            # outside local mode a bare name names no namespace: refused, naming the ways
            bare = grpcaio.InferInput("INPUT0", [1, 16], "FP32")
            bare.set_data_from_numpy(reference.inputs[0])
            with pytest.raises(InferenceServerException) as refused:
                await client.infer("mlp-grpc", [bare])
            assert refused.value.status() == "StatusCode.INVALID_ARGUMENT"
            assert "modelswap-namespace" in refused.value.message()
        finally:
            await client.close()
        problems = [
            p for seed, r in zip(seeds, results, strict=True)
            if (p := problem(reference, seed, expected, r)) is not None
        ]  # fmt: skip
        assert problems == [], problems[:5]
        text = (await http.get(metrics_url)).text
        assert sample(text, swap_ins, uid=uid) - before == 1
        assert sample(text, "modelswap_gateway_requests_total", uid=uid, code="200") == BURST
        assert (await control.model(uid))["state"] == "Resident"

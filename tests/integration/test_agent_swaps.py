"""The agent against real Triton (sim backend, two sim GPUs): the desired set loads and
answers, idle models swap out and free their HBM (seen in the stub's own mappings), swaps
bring back the same bytes, pinned models stay, policy changes apply without a restart."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import httpx
import numpy as np
import pytest

from examples.models import reference
from tests.support.agent_harness import (
    MIB,
    Control,
    Models,
    Triton,
    entry,
    new_uid,
    node,
    sim_hbm_mapped_bytes,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


async def mlp_answers_match(models: Models, uid: str, seed: int = 1) -> bool:
    """The served MLP answers as the reference does and its whole region is intact."""
    x = reference.mlp_input(seed)
    answer = await models.mlp(uid, x)
    assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)
    assert answer.checksum == reference.mlp_checksum(32 * MIB)
    return answer.restored


def stub_of(triton: Triton, uid: str) -> int:
    pids = triton.stub_pids(uid)
    assert len(pids) == 1, pids
    return pids[0]


async def test_serves_swaps_by_idle_request_and_hand_keeps_pinned(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, agent, control, models = n.parts()
        mlp, lm = new_uid(), new_uid()
        never = {"idleAfter": "never", "minResident": "0s"}
        pinned = {"pinned": True, "idleAfter": "1s", "minResident": "0s"}
        kv = {"offloadAfterTokens": 32, "hostBytes": "2Mi"}
        results = await control.desired(
            [
                entry(mlp, swap_policy=never),
                entry(lm, model="tinylm", swap_policy=pinned, kv_cache=kv),
            ]
        )
        assert {r["outcome"] for r in results.values()} == {"applied"}
        await control.wait_state(mlp, "Resident")
        await control.wait_state(lm, "Resident")
        info = await control.models()
        assert {info[mlp]["gpu"], info[lm]["gpu"]} == {"sim-gpu-0", "sim-gpu-1"}  # most free first

        # The desired set answers, from bytes that came through the agent.
        assert await mlp_answers_match(models, mlp) is False  # loaded from the source
        expected = reference.tinylm_generate([5, 9, 2], 40, offload_after_tokens=32)
        stream = await models.tinylm(lm, [5, 9, 2], 40)
        assert [(e["TOKEN"], e["INDEX"], e["TIER"]) for e in stream] == [
            (t.token, t.index, t.tier) for t in expected
        ]
        assert 1 in {e["TIER"] for e in stream}  # the long sequence reached the host tier
        assert stream[-1]["CHECKSUM"] == reference.tinylm_checksum(64 * MIB)
        mlp_stub, lm_stub = stub_of(triton, mlp), stub_of(triton, lm)
        assert sim_hbm_mapped_bytes(mlp_stub) == 32 * MIB
        assert sim_hbm_mapped_bytes(lm_stub) == 68 * MIB

        # A policy change through PUT /v1/desired applies to the running model: idle after 2s.
        idle = {"idleAfter": "2s", "minResident": "1s"}
        control_results = await control.desired(
            [
                entry(mlp, generation=2, swap_policy=idle),
                entry(lm, model="tinylm", swap_policy=pinned, kv_cache=kv),
            ]
        )
        assert control_results[mlp]["outcome"] == "applied"
        out = await control.wait_state(mlp, "SwappedOut", timeout_seconds=30)
        assert out["residentBytes"] == 0 and out["hostBytes"] == 32 * MIB
        # Independently of the engine: the stub maps no sim-GPU memory any more.
        assert sim_hbm_mapped_bytes(mlp_stub) == 0
        node_info = (await control.client.get("/v1/node")).json()
        free = {g["uuid"]: g["hbmFreeBytes"] for g in node_info["gpus"]}
        assert free[info[mlp]["gpu"]] == 128 * MIB

        # The pinned model (idleAfter 1s) never left.
        lm_info = await control.model(lm)
        assert lm_info["state"] == "Resident" and lm_info["swapOuts"] == 0
        assert sim_hbm_mapped_bytes(lm_stub) == 68 * MIB
        refused = await control.swap(lm, "out")
        assert refused.status_code == 409 and refused.json()["reason"] == "Pinned"

        # A request swaps the model in: the same answers, the same stub.
        assert await mlp_answers_match(models, mlp, seed=2) is False
        back = await control.wait_state(mlp, "Resident", "SwappedOut")
        assert back["swapIns"] >= 1
        assert stub_of(triton, mlp) == mlp_stub

        # By hand: out, then in, same answers.
        done = await control.swap(mlp, "out")
        assert done.status_code == 200, done.text
        assert (await control.model(mlp))["state"] == "SwappedOut"
        assert sim_hbm_mapped_bytes(mlp_stub) == 0
        done = await control.swap(mlp, "in")
        assert done.json()["outcome"] == "completed", done.text
        assert sim_hbm_mapped_bytes(mlp_stub) == 32 * MIB
        await mlp_answers_match(models, mlp, seed=3)

        # Metrics are served and count what happened.
        async with httpx.AsyncClient(trust_env=False) as client:
            text = (await client.get(f"http://127.0.0.1:{agent.metrics_port}/metrics")).text
        assert (
            f'modelswap_swap_outs_total{{model="mlp",namespace="default",reason="Idle",uid="{mlp}"}}'
            in text
        )
        assert "modelswap_hbm_used_bytes" in text
        (lag_samples,) = re.findall(
            r"^modelswap_agent_event_loop_lag_seconds_count (\S+)$", text, re.M
        )
        assert float(lag_samples) > 0  # the running agent watches its event loop


async def test_swapped_out_tinylm_streams_the_same_tokens(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, _agent, control, models = n.parts()
        lm = new_uid()
        await control.desired([entry(lm, model="tinylm", swap_policy={"idleAfter": "never"})])
        await control.wait_state(lm, "Resident")
        before = await models.tinylm(lm, [1, 2, 3], 12)
        assert [e["TOKEN"] for e in before] == [
            t.token for t in reference.tinylm_generate([1, 2, 3], 12)
        ]
        assert (await control.swap(lm, "out")).status_code == 200
        assert sim_hbm_mapped_bytes(stub_of(triton, lm)) == 0
        # A request swaps it back in; a paced stream holds in_use() until its last token,
        # so a swap-out asked for meanwhile completes only after the stream is whole.
        stream = asyncio.create_task(models.tinylm(lm, [1, 2, 3], 12, delay_ms=50))
        await control.wait_state(lm, "Resident")
        swap_out = await control.swap(lm, "out")
        assert swap_out.json()["outcome"] == "completed", swap_out.text
        assert stream.done()
        after = await stream
        assert [(e["TOKEN"], e["CHECKSUM"]) for e in after] == [
            (e["TOKEN"], e["CHECKSUM"]) for e in before
        ]
        assert (await control.model(lm))["swapIns"] >= 1


async def test_an_entry_that_cannot_fit_is_deferred(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, _agent, control, _models = n.parts()
        big = new_uid()
        results = await control.desired([entry(big, weights="200Mi")])
        assert results[big]["outcome"] == "deferred"
        assert results[big]["reason"] == "InsufficientHBM"
        assert "LargerThanBudget" in results[big]["message"]
        info = await control.model(big)
        assert info["phase"] == "Pending" and info["reason"] == "InsufficientHBM"
        assert "LargerThanBudget" in info["message"]
        assert triton.stub_pids(big) == []


async def test_wrong_or_missing_token_changes_nothing(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        _triton, agent, control, models = n.parts()
        uid = new_uid()
        await control.desired([entry(uid)])
        await control.wait_state(uid, "Resident")
        body = {"revision": {"term": 5, "counter": 1}, "entries": []}
        async with httpx.AsyncClient(base_url=agent.base_url, trust_env=False) as anon:
            r = await anon.put("/v1/desired", json=body)
            assert r.status_code == 401
            r = await anon.post(f"/v1/models/{uid}/swap-out")
            assert r.status_code == 401
        wrong = Control(agent.base_url, token="not-the-token")
        try:
            r = await wrong.put([], term=5)
            assert r.status_code == 403
            assert (await wrong.swap(uid, "out")).status_code == 403
        finally:
            await wrong.close()
        # Nothing changed: still desired, resident, no unload pending, revision unchanged.
        info = await control.model(uid)
        assert info["state"] == "Resident" and info["desired"] and "unloadInSeconds" not in info
        node_info = (await control.client.get("/v1/node")).json()
        assert node_info["revision"] == {"term": 1, "counter": 1}
        await mlp_answers_match(models, uid)

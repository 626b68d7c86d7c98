"""Faults: kill -9 of Triton (restarted: every model back from the host store, no byte
lost) and kill -9 of the agent alone (models keep answering; the restarted agent's clients
readopt and it takes its models back)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from examples.models import reference
from tests.support.agent_harness import MIB, entry, new_uid, node, sim_hbm_mapped_bytes

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]


@pytest.mark.timeout(180)
async def test_triton_killed_and_restarted_models_come_back_from_the_host_store(
    tmp_path: Path,
) -> None:
    async with node(tmp_path) as n:
        triton, _agent, control, models = n.parts()
        mlp, lm = new_uid(), new_uid()
        await control.desired(
            [
                entry(mlp, swap_policy={"idleAfter": "never"}),
                entry(lm, model="tinylm", swap_policy={"idleAfter": "never"}),
            ]
        )
        await control.wait_state(mlp, "Resident")
        await control.wait_state(lm, "Resident")
        x = reference.mlp_input(11)
        before = await models.mlp(mlp, x)
        tokens_before = await models.tinylm(lm, [7, 7, 1], 8)
        old_pid = triton.pid

        await triton.kill9()  # stubs die with it; its shm regions are removed
        await triton.start()  # same ports, new pid (the pid file tells the agent)
        assert triton.pid != old_pid
        await control.wait_state(mlp, "Resident", timeout_seconds=60)
        await control.wait_state(lm, "Resident", timeout_seconds=60)

        after = await models.mlp(mlp, x)
        assert after.restored  # from the host store, not the source
        assert np.array_equal(after.output, before.output)
        assert after.checksum == before.checksum == reference.mlp_checksum(32 * MIB)
        tokens_after = await models.tinylm(lm, [7, 7, 1], 8)
        assert [e["TOKEN"] for e in tokens_after] == [e["TOKEN"] for e in tokens_before]
        assert tokens_after[-1]["CHECKSUM"] == tokens_before[-1]["CHECKSUM"]
        assert tokens_after[-1]["RESTORED"] is True


@pytest.mark.timeout(180)
async def test_agent_killed_models_keep_answering_and_are_readopted(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, agent, control, models = n.parts()
        uid = new_uid()
        desired = [entry(uid, swap_policy={"idleAfter": "never"})]
        await control.desired(desired)
        await control.wait_state(uid, "Resident")
        x = reference.mlp_input(13)
        before = await models.mlp(uid, x)
        stub = triton.stub_pids(uid)

        await agent.kill9()
        during = await models.mlp(uid, x)  # Triton and the stub serve on without the agent
        assert np.array_equal(during.output, before.output)

        await agent.start()
        # Held again before any push (from its desired file); the operator's next push
        # (every grace/3) finds it in place.
        await control.wait_state(uid, "Resident", timeout_seconds=30)
        results = await control.desired(desired)
        assert results[uid]["outcome"] == "applied" and results[uid]["reason"] == "Updated"
        assert (await control.model(uid))["desired"]
        assert triton.stub_pids(uid) == stub  # the same process: readopted, not reloaded
        after = await models.mlp(uid, x)
        assert np.array_equal(after.output, before.output) and after.checksum == before.checksum

        # The restarted agent really holds the memory again: it can swap the model out/in.
        out = await control.swap(uid, "out")
        assert out.json()["outcome"] == "completed", out.text
        assert sim_hbm_mapped_bytes(stub[0]) == 0
        back = await control.swap(uid, "in")
        assert back.json()["outcome"] == "completed", back.text
        final = await models.mlp(uid, x)
        assert np.array_equal(final.output, before.output)

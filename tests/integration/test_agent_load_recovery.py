"""Loads that stall or fail, and models whose processes die, against real Triton (sim GPU,
the example MLP): nothing holds a GPU that others need, and every model serves again
within a stated bound.

- a dropped (`onSwapOut: drop`) model swapped in holds fresh memory until a request loads
  its weights; one that fails before the model runs (a wrong input name) loads nothing.
  It is weighed as resident: another model's swap-in takes it as a victim at once (issue
  12, finding 7: it was weighed as a load under way and every swap-in on its GPU waited
  30 s and was refused `WaitingForLoads`), and past `triton.loadTimeoutSeconds` it is
  dropped again with reason `ReloadTimedOut`;
- after a Triton restart the models are placed again one by one within the HBM budget
  (finding 9: all were attached at once, one attach was refused and the model stayed
  `LoadFailed` for 60 s);
- a model process killed -9 is loaded again (its stub restores from the host store).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from examples.models import reference
from tests.support.agent_harness import (
    MIB,
    AgentConfig,
    Control,
    Models,
    entry,
    new_uid,
    node,
)

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

#: What this suite promises: a model swapped out to make room, reloaded after a Triton
#: restart or after its process died answers again within this many seconds (measured
#: here on 2 shared CPU cores: a few seconds).
RECOVERY_BOUND_SECONDS = 30.0


async def answers(models: Models, uid: str, weights_bytes: int, seed: int = 3) -> bool:
    x = reference.mlp_input(seed)
    answer = await models.mlp(uid, x)
    assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)
    assert answer.checksum == reference.mlp_checksum(weights_bytes)
    return answer.restored


async def swapped(control: Control, uid: str, direction: str) -> dict[str, Any]:
    response = await control.swap(uid, direction)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result


@pytest.mark.timeout(240)
async def test_a_dropped_model_waiting_for_its_reload_never_blocks_its_gpu(
    tmp_path: Path,
) -> None:
    config = AgentConfig(gpu_bytes=(128 * MIB,), load_timeout_seconds=20.0)
    async with node(tmp_path, config) as n:
        _triton, _agent, control, models = n.parts()
        pinned, big, dropped = new_uid(), new_uid(), new_uid()
        keep = {"idleAfter": "never", "minResident": "0s"}
        pinned_entry = entry(pinned, weights="64Mi", swap_policy={**keep, "pinned": True})
        big_entry = entry(big, name="big", weights="64Mi", swap_policy=keep)
        await control.desired([pinned_entry, big_entry])
        # the two fill the GPU past its high watermark: the policy may swap `big` out the
        # moment it is loaded (minResident 0s), sooner than a poll sees it resident
        await control.wait_state(big, "Resident", "SwappedOut")
        assert (await swapped(control, big, "out"))["outcome"] in ("completed", "unchanged")
        await control.wait_state(big, "SwappedOut")
        drop_entry = entry(dropped, name="drop", swap_policy={**keep, "onSwapOut": "drop"})
        await control.desired([pinned_entry, big_entry, drop_entry])
        await control.wait_state(dropped, "Resident")

        # Dropped, then swapped in with no request that loads its weights (what a request
        # with a wrong input name through the gateway leaves): fresh memory held, Loading.
        assert (await swapped(control, dropped, "out"))["outcome"] == "completed"
        await control.wait_state(dropped, "Dropped")
        assert (await swapped(control, dropped, "in"))["outcome"] == "completed"
        await control.wait_state(dropped, "Loading")

        # The GPU's other model swaps in at once, taking the waiting one as its victim.
        started = time.monotonic()
        result = await swapped(control, big, "in")
        assert result["outcome"] == "completed", result
        assert time.monotonic() - started < 10.0
        # read at once, it said Loading in one clean-clone run under load (why is not known
        # yet): it must read Dropped soon, and a model that stays Loading still fails here
        await control.wait_state(dropped, "Dropped", timeout_seconds=10.0)
        await answers(models, big, 64 * MIB)

        # Alone on its GPU, a stalled reload ends after triton.loadTimeoutSeconds: dropped
        # again, the reason and message say why. (The full GPU is above the high
        # watermark: the policy may have swapped `big` out already.)
        assert (await swapped(control, big, "out"))["outcome"] in ("completed", "unchanged")
        await control.wait_state(big, "SwappedOut")
        assert (await swapped(control, dropped, "in"))["outcome"] == "completed"
        await control.wait_state(dropped, "Loading")
        ended = await control.wait_state(dropped, "Dropped", timeout_seconds=60)
        assert ended["reason"] == "ReloadTimedOut", ended
        assert "loadTimeoutSeconds" in ended["message"], ended
        # A valid request loads it again from its source; the reason clears.
        assert not await answers(models, dropped, 32 * MIB)
        back = await control.wait_state(dropped, "Resident")
        assert back["reason"] != "ReloadTimedOut", back


async def _states_until_all_answer(
    control: Control, models: Models, uids: list[str], weights_bytes: int
) -> set[str]:
    """Every state seen while asking each model until all answered (within the bound)."""
    seen: set[str] = set()
    deadline = time.monotonic() + RECOVERY_BOUND_SECONDS
    pending = list(uids)
    while pending:
        assert time.monotonic() < deadline, f"not answering within the bound: {pending}"
        seen |= {m.get("state", "") for m in (await control.models()).values()}
        uid = pending[0]
        try:
            await answers(models, uid, weights_bytes)
        except AssertionError:
            await asyncio.sleep(0.2)
            continue
        pending.pop(0)
    return seen


@pytest.mark.timeout(240)
async def test_after_a_triton_restart_models_are_reloaded_within_the_hbm_budget(
    tmp_path: Path,
) -> None:
    config = AgentConfig(gpu_bytes=(128 * MIB,))
    async with node(tmp_path, config) as n:
        triton, _agent, control, models = n.parts()
        uids = [new_uid() for _ in range(3)]
        keep = {"idleAfter": "never", "minResident": "0s"}
        entries = [
            entry(u, name=f"m{i}", weights="64Mi", swap_policy=keep) for i, u in enumerate(uids)
        ]
        await control.desired(entries)
        for uid in uids:  # the GPU holds two of them; placing the third swapped one out
            await control.wait_state(uid, "Resident", "SwappedOut")
        for uid in uids:
            await answers(models, uid, 64 * MIB)

        await triton.kill9()
        await triton.start()
        seen = await _states_until_all_answer(control, models, uids, 64 * MIB)
        assert "Failed" not in seen, seen
        states = {u: m["state"] for u, m in (await control.models()).items()}
        assert sorted(states.values()).count("Resident") <= 2, states
        assert all(s in ("Resident", "SwappedOut") for s in states.values()), states


@pytest.mark.timeout(180)
async def test_a_model_process_killed_is_reloaded_from_the_host_store(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, _agent, control, models = n.parts()
        uid = new_uid()
        await control.desired([entry(uid, swap_policy={"idleAfter": "never"})])
        await control.wait_state(uid, "Resident")
        await answers(models, uid, 32 * MIB)
        stub = triton.stub_pids(uid)
        assert len(stub) == 1, stub

        os.kill(stub[0], signal.SIGKILL)
        started = time.monotonic()

        async def new_stub() -> bool:
            pids = triton.stub_pids(uid)
            return bool(pids) and pids != stub

        while not await new_stub():
            assert time.monotonic() - started < RECOVERY_BOUND_SECONDS, "no new stub"
            await asyncio.sleep(0.1)
        await control.wait_state(uid, "Resident", timeout_seconds=RECOVERY_BOUND_SECONDS)
        assert await answers(models, uid, 32 * MIB)  # restored from the host store

"""The whole node under its real supervisor: `modelswap node` running the real agent
(`modelswap sidecar`) and the real `tritonserver`, the example models answering as
`examples/models/reference.py` says through every fault:

- kill -9 of the agent alone: the supervisor restarts it, the same stub processes readopt
  their memory, the models answer throughout and the new agent can swap them again;
- kill -9 of Triton: restarted, every model back from the host store, same answers;
- SIGTERM to the supervisor: exit 0, nothing left running (no stubs, no shm regions);
- the agent killed six times in a row, each time soon after it serves: each restart
  within the promised 4 s of the kill (docs/NODE.md), serving again soon after.
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
import pytest_asyncio

from examples.models import reference
from modelswap_sidecar.supervisor.processes import group_members
from modelswap_sidecar.triton.process import shm_regions
from tests.support.agent_harness import MIB, Models, entry, new_uid, sim_hbm_mapped_bytes
from tests.support.node_supervised import SupervisedNode

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]

PROMPT = [5, 9, 2]
TOKENS = 12


@pytest_asyncio.fixture
async def node() -> AsyncIterator[SupervisedNode]:
    # A short folder: the agent's Unix socket path must stay under 108 bytes.
    folder = Path(tempfile.mkdtemp(prefix="ms-node-"))
    under_test = SupervisedNode(folder)
    try:
        yield under_test
    except BaseException:
        print(under_test.tail())
        raise
    finally:
        await under_test.close()
        shutil.rmtree(folder, ignore_errors=True)


def running(pid: int) -> bool:
    """Alive and not a zombie (one its new parent has yet to reap is not running)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


async def answers_as_the_reference_says(models: Models, mlp: str, lm: str) -> tuple[bool, bool]:
    """Both models answer exactly as the reference computes; whether each was restored."""
    x = reference.mlp_input(17)
    answer = await models.mlp(mlp, x)
    assert np.allclose(answer.output, reference.mlp_forward(x), atol=1e-5)
    assert answer.checksum == reference.mlp_checksum(32 * MIB)
    stream = await models.tinylm(lm, PROMPT, TOKENS)
    expected = reference.tinylm_generate(PROMPT, TOKENS, offload_after_tokens=32)
    assert [(e["TOKEN"], e["INDEX"]) for e in stream] == [(t.token, t.index) for t in expected]
    assert stream[-1]["CHECKSUM"] == reference.tinylm_checksum(64 * MIB)
    return answer.restored, bool(stream[-1]["RESTORED"])


@pytest.mark.timeout(240)
async def test_node_survives_agent_and_triton_kills_and_stops_clean(node: SupervisedNode) -> None:
    await node.start()
    control, models = node.control, node.models
    mlp, lm = new_uid(), new_uid()
    never = {"idleAfter": "never"}
    desired = [entry(mlp, swap_policy=never), entry(lm, model="tinylm", swap_policy=never)]
    results = await control.desired(desired)
    assert {r["outcome"] for r in results.values()} == {"applied"}, results
    await control.wait_state(mlp, "Resident")
    await control.wait_state(lm, "Resident")
    assert await answers_as_the_reference_says(models, mlp, lm) == (False, False)
    stubs = {uid: node.stub_pids(uid) for uid in (mlp, lm)}
    assert all(stubs.values())

    # A changed spec.model for a held model is refused, naming the field; it serves on.
    resized = entry(mlp, generation=2, weights="16Mi", swap_policy=never)
    answer = (await control.desired([resized, desired[1]]))[mlp]
    assert (answer["outcome"], answer["reason"]) == ("conflict", "ModelChanged"), answer
    assert "spec.model.weightsBytes" in answer["message"]
    assert (await control.model(mlp))["generation"] == 1
    triton = node.child("runtime")["pid"]

    # kill -9 of the agent alone: the supervisor restarts it; Triton never stops.
    agent = node.child("agent")["pid"]
    os.killpg(agent, signal.SIGKILL)
    assert await answers_as_the_reference_says(models, mlp, lm) == (False, False)
    await node.agent_serving(not_pid=agent)
    assert node.child("agent")["restarts"] == 1
    await control.wait_state(mlp, "Resident", timeout_seconds=30)
    await control.wait_state(lm, "Resident", timeout_seconds=30)
    # Still desired before the operator's next push (the agent's desired file says so).
    held = await control.models()
    assert held[mlp]["desired"] and held[lm]["desired"]
    assert node.child("runtime")["pid"] == triton and node.child("runtime")["restarts"] == 0
    assert {uid: node.stub_pids(uid) for uid in (mlp, lm)} == stubs  # readopted, not reloaded
    assert await answers_as_the_reference_says(models, mlp, lm) == (False, False)
    # The new agent holds the memory again: it can swap a model out (HBM unmapped in the
    # stub) and back in.
    out = await control.swap(mlp, "out")
    assert out.json()["outcome"] == "completed", out.text
    assert sim_hbm_mapped_bytes(stubs[mlp][0]) == 0
    back = await control.swap(mlp, "in")
    assert back.json()["outcome"] == "completed", back.text
    assert sim_hbm_mapped_bytes(stubs[mlp][0]) == 32 * MIB

    # kill -9 of Triton: restarted, every model reloaded from the host store.
    os.kill(triton, signal.SIGKILL)
    new_triton = await node.child_pid("runtime", not_pid=triton)
    await node.triton_ready()
    assert group_members(triton) == [], "the dead Triton's stubs were left running"
    assert node.child("agent")["restarts"] == 1  # the agent rode it out
    await control.wait_state(mlp, "Resident", timeout_seconds=60)
    await control.wait_state(lm, "Resident", timeout_seconds=60)
    assert await answers_as_the_reference_says(models, mlp, lm) == (True, True)
    new_stubs = [pid for uid in (mlp, lm) for pid in node.stub_pids(uid)]
    assert new_stubs and not set(new_stubs) & {pid for pids in stubs.values() for pid in pids}

    # SIGTERM to the supervisor: everything stops, nothing is left.
    agent = node.child("agent")["pid"]
    assert node.stop() == 0
    for pgid in (agent, new_triton):
        assert group_members(pgid) == [], f"group {pgid} left running"
    for pid in new_stubs:
        assert not running(pid), f"stub {pid} left running"
    assert shm_regions(node.shm_prefix) == []


#: docs/NODE.md: a killed child starts again within `maxBackoffSeconds` (4 s) of its exit;
#: the slack covers noticing the exit and spawning on a loaded machine.
PROMISED_RESTART_SECONDS = 4.0 + 2.0
#: ... and the agent serves again after its own start (generous: a shared 2-core machine).
SERVING_AGAIN_SECONDS = 30.0


@pytest.mark.timeout(300)
async def test_an_agent_killed_again_and_again_is_back_within_the_promise(
    node: SupervisedNode,
) -> None:
    await node.start()
    restarts, serving = [], []
    for _ in range(6):  # before the cap, the 5th and 6th waited 8 s and 16 s
        agent = node.child("agent")["pid"]
        killed = time.monotonic()
        os.killpg(agent, signal.SIGKILL)
        await node.child_pid("agent", not_pid=agent)
        restarts.append(time.monotonic() - killed)
        await node.agent_serving(not_pid=agent)
        serving.append(time.monotonic() - killed)
    print(f"restart after kill: {[f'{s:.1f}' for s in restarts]} s; "
          f"serving again: {[f'{s:.1f}' for s in serving]} s")  # fmt: skip
    assert max(restarts) <= PROMISED_RESTART_SECONDS, restarts
    assert max(serving) <= SERVING_AGAIN_SECONDS, serving
    assert node.child("agent")["restarts"] == 6
    assert node.stop() == 0

"""Model instances on a real agent (real Triton, sim GPUs; issue 27, item 2): an entry with
a new model generation is a new instance, loaded beside the old one under its own Triton
name; the old one serves until the new one answers and is then released.

Failure paths: a new model generation that fails to load leaves the old one serving,
reported `RolloutFailed`, also after the agent is killed mid-rollout (both instances taken
back, the old one readopted); the set going back to the old model generation drops the failed
instance; a changed `spec.model` under the same model generation is still refused
(`ModelChanged`), without pointing at the internal DELETE.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from examples.models import reference
from modelswap_sidecar.agent.core.instances import instance_key
from modelswap_sidecar.triton.naming import triton_model_name
from tests.support.agent_harness import MIB, Triton, entry, new_uid, node
from tests.support.waiting import until_async

pytestmark = [pytest.mark.slow, pytest.mark.asyncio]
NEVER = {"idleAfter": "never", "minResident": "0s"}


def at(model_generation: int, generation: int, **fields: Any) -> dict[str, Any]:
    return entry(UID, generation=generation, swap_policy=NEVER, **fields) | {
        "modelGeneration": model_generation
    }


UID = new_uid()


async def ready_in_triton(triton: Triton) -> set[str]:
    async with httpx.AsyncClient(timeout=10, trust_env=False) as http:
        response = await http.post(f"http://{triton.url}/v2/repository/index", json={})
    response.raise_for_status()
    return {m["name"] for m in response.json() if m.get("state") == "READY"}


@pytest.mark.timeout(240)
async def test_instances_roll_out_fail_back_and_release(tmp_path: Path) -> None:
    async with node(tmp_path) as n:
        triton, agent, control, models = n.parts()
        first = triton_model_name(UID)
        assert (await control.desired([at(1, 1)]))[UID]["outcome"] == "applied"
        await control.wait_state(UID, "Resident")
        x = reference.mlp_input(5)
        assert (await models.mlp(UID, x)).checksum == reference.mlp_checksum(32 * MIB)

        # A new model generation whose source is missing: the old one serves on.
        broken = at(2, 2, source={"uri": "/models/missing"})
        answer = (await control.desired([broken]))[UID]
        assert (answer["outcome"], answer["reason"]) == ("applied", "RollingOut"), answer

        async def failed() -> dict[str, Any] | None:
            info = await control.model(UID)
            return info if info.get("rolloutReason") == "RolloutFailed" else None

        info = await until_async(failed, "the rollout reported failed", 60)
        assert info["modelGeneration"] == 1 and info["phase"] == "Resident", info
        assert info["rolloutModelGeneration"] == 2 and "old one serves" in info["rolloutMessage"]
        assert (await models.mlp(UID, x)).checksum == reference.mlp_checksum(32 * MIB)

        # The agent killed mid-rollout: the new one takes back both instances (the old
        # one readopted from Triton, serving on), and the next push goes on with the rollout.
        await agent.kill9()
        await agent.start()

        async def adopted() -> dict[str, Any] | None:
            info = await control.model(UID)
            # Empty until the restarted agent has taken the instances back.
            return info if info.get("phase") == "Resident" else None

        info = await until_async(adopted, "the old instance readopted", 60)
        assert info["modelGeneration"] == 1, info
        assert (await models.mlp(UID, x)).checksum == reference.mlp_checksum(32 * MIB)
        await control.desired([broken])
        info = await until_async(failed, "the rollout reported failed again", 60)
        assert info["modelGeneration"] == 1 and info["phase"] == "Resident", info

        # The set goes back to model generation 1: the failed instance is dropped.
        answer = (await control.desired([at(1, 3)]))[UID]
        assert answer["outcome"] == "applied", answer

        async def settled() -> dict[str, Any] | None:
            info = await control.model(UID)
            return info if "rolloutReason" not in info else None

        info = await until_async(settled, "the rollout note cleared", 30)
        assert info["modelGeneration"] == 1 and info["generation"] == 3, info
        assert len(await control.models()) == 1

        # A changed spec.model under the same model generation: refused, serving on.
        refused = (await control.desired([at(1, 4, weights="48Mi")]))[UID]
        assert (refused["outcome"], refused["reason"]) == ("conflict", "ModelChanged"), refused
        assert "DELETE" not in refused["message"] and "modelGeneration" in refused["message"]

        # A new model generation that loads: beside the old one, then the old one released.
        second = triton_model_name(instance_key(UID, 5))
        answer = (await control.desired([at(5, 5, weights="48Mi")]))[UID]
        assert (answer["outcome"], answer["reason"]) == ("applied", "RollingOut"), answer

        async def switched() -> dict[str, Any] | None:
            info = await control.model(UID)
            return info if info.get("modelGeneration") == 5 else None

        info = await until_async(switched, "model generation 5 reported", 60)
        assert info["phase"] == "Resident", info
        new_answer = await models.mlp(instance_key(UID, 5), x)
        assert new_answer.checksum == reference.mlp_checksum(48 * MIB)

        async def released() -> bool:
            names = await ready_in_triton(triton)
            return second in names and first not in names

        await until_async(released, "the old instance out of Triton", 60)
        await until_async(settled, "the rollout note cleared once released", 30)
        listed = await control.models()
        assert list(listed) == [UID] and listed[UID]["modelGeneration"] == 5

        # The control API's swaps act on the instance that serves and name the uid asked.
        out = (await control.swap(UID, "out")).json()
        assert (out["uid"], out["outcome"]) == (UID, "completed"), out
        back = (await control.swap(UID, "in")).json()
        assert (back["uid"], back["outcome"]) == (UID, "completed"), back

        # Out of the set: every instance goes once the grace period ends.
        await control.desired([])

        async def unloaded() -> bool:
            return not (await ready_in_triton(triton)) & {first, second}

        await until_async(unloaded, "no instance left in Triton", 60)


@pytest.mark.timeout(240)
async def test_without_room_for_both_the_old_instance_goes_first(tmp_path: Path) -> None:
    uid = new_uid()

    def sized(model_generation: int, weights: str) -> dict[str, Any]:
        body = entry(uid, generation=model_generation, swap_policy=NEVER, weights=weights)
        return body | {"modelGeneration": model_generation, "gpu": "sim-gpu-0"}

    async with node(tmp_path) as n:  # two 128Mi GPUs: 96Mi and 100Mi do not fit one
        triton, _agent, control, models = n.parts()
        assert (await control.desired([sized(1, "96Mi")]))[uid]["outcome"] == "applied"
        await control.wait_state(uid, "Resident")
        answer = (await control.desired([sized(2, "100Mi")]))[uid]
        assert (answer["outcome"], answer["reason"]) == ("applied", "RolloutInterrupts"), answer
        assert "released first" in answer["message"]
        # The operator's heartbeat pushes the same set again while the old one is released:
        # the rollout stays an interrupted one (requests keep waiting for the new instance).
        notes = set()
        for _ in range(20):
            again = (await control.desired([sized(2, "100Mi")]))[uid]
            assert again["outcome"] == "applied", again
            info = await control.model(uid)
            notes.add(info.get("rolloutReason"))
            if info.get("modelGeneration") == 2 and info["phase"] == "Resident":
                break
        assert notes <= {"RolloutInterrupts", None}, notes

        async def served() -> dict[str, Any] | None:
            info = await control.model(uid)
            done = info.get("modelGeneration") == 2 and info["phase"] == "Resident"
            return info if done and "rolloutReason" not in info else None

        await until_async(served, "model generation 2 serving", 60)
        x = reference.mlp_input(2)
        new_answer = await models.mlp(instance_key(uid, 2), x)
        assert new_answer.checksum == reference.mlp_checksum(100 * MIB)
        assert triton_model_name(uid) not in await ready_in_triton(triton)

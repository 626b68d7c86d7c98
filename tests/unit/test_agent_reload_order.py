"""After a Triton restart the agent places the models it served again in the policy's
`load_order` (issue 26, item 5): with room for only the pinned model and one other, the
pinned one loads (even though its uid sorts last) and the lower-priority one is the one
that waits, and no load is started past the GPU's budget. Over a fake engine and a loader
that refuses, as a real attach would, any load past the budget (`LoadFailed`)."""

from __future__ import annotations

import asyncio
import time
from typing import cast

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.placement import Placement
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.errors import LoadError
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import EngineError
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.decisions import SwapOut, SwapOutReason
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from tests.unit.test_agent_planning import MIB, model, uid_of
from tests.unit.test_agent_reload import FakeEngine, settle

BUDGET_BYTES = 128 * MIB  # FakeEngine's one GPU: two 48 MiB models fit, three do not


class BudgetLoader:
    """Loads in order of call; refuses one that would hold more than the budget, as the
    engine refuses an attach it has no room for."""

    def __init__(self, records: dict[str, AgentModel]) -> None:
        self.records = records
        self.loaded: list[str] = []

    async def load(self, model: AgentModel) -> None:
        held = sum(self.records[uid].hbm_bytes for uid in self.loaded)
        if held + model.hbm_bytes > BUDGET_BYTES:
            raise LoadError("LoadFailed", f"no room for {model.uid}")
        self.loaded.append(model.uid)

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        if model.uid in self.loaded:
            self.loaded.remove(model.uid)


def names_by_uid(*names: str) -> list[str]:
    return sorted(names, key=uid_of)


def test_after_a_triton_restart_the_pinned_model_loads_and_the_lowest_priority_waits() -> None:
    asyncio.run(restart_with_room_for_two())


async def restart_with_room_for_two() -> None:
    # uids decide the roles: the pinned model's sorts last, the one swapped out first
    swapped, other, pinned = names_by_uid("alpha", "bravo", "charlie")
    now = time.monotonic()
    records = {}
    for name, swap in (
        (swapped, {"priority": 5}),  # swapped out before the restart, but more important
        (other, {"priority": 0}),
        (pinned, {"pinned": True, "priority": 0}),
    ):
        m = model(name, 0, Serving.LOADED, mib=48, **swap)
        m.resident_since_seconds = None if name == swapped else now - 600
        records[m.uid] = m
    engine = FakeEngine()
    loader = BudgetLoader(records)
    actuator = Actuator(
        engine=cast(Engine, engine),
        loader=cast(ModelLoader, loader),
        policy=Policy(PolicySettings(), time.monotonic),
        gpu_uuids=("g0",),
        metrics=None,
        records=records,
    )
    # the old Triton's processes are gone: the pid changed and the runtime watch asks
    assert actuator.reload_all() == 3
    await settle(actuator)

    by_name = {m.entry.name: m for m in records.values()}
    assert loader.loaded == [uid_of(pinned), uid_of(swapped)]
    assert by_name[pinned].serving is Serving.LOADED
    assert by_name[swapped].serving is Serving.LOADED
    assert by_name[other].serving is Serving.DEFERRED, by_name[other].message
    assert by_name[other].reason == "WaitingForRoom"
    assert not any(m.serving is Serving.FAILED for m in records.values())


class RefusingEngine(FakeEngine):
    """A victim that cannot be drained: its swap-out is refused, as the engine refuses
    one whose model is committing or whose drain ran out."""

    def swap_out(self, name: str, reason: str) -> None:
        raise EngineError(f"{name}: requests still in flight")


def test_a_load_whose_victim_refuses_to_go_waits_instead_of_over_committing() -> None:
    asyncio.run(victim_refuses())


async def victim_refuses() -> None:
    now = time.monotonic()
    busy = model("busy", 0, Serving.LOADED, mib=96)
    busy.resident_since_seconds = now - 600
    waiting = model("waiting", None, Serving.PENDING, mib=96)
    records = {busy.uid: busy, waiting.uid: waiting}
    engine = RefusingEngine()
    engine.added.append(busy.triton_name)
    engine.states[busy.triton_name] = EngineState.RESIDENT
    loader = BudgetLoader(records)
    loader.loaded.append(busy.uid)
    actuator = Actuator(
        engine=cast(Engine, engine),
        loader=cast(ModelLoader, loader),
        policy=Policy(PolicySettings(), time.monotonic),
        gpu_uuids=("g0",),
        metrics=None,
        records=records,
    )
    victim = SwapOut(uid=busy.uid, gpu="g0", reason=SwapOutReason.MAKE_ROOM, message="room",
                     bytes_freed=busy.hbm_bytes)  # fmt: skip
    actuator.start_load(waiting, Placement(gpu="g0", victims=(victim,), message="evicting"))
    await settle(actuator)

    assert loader.loaded == [busy.uid]  # no load past the budget was tried
    assert busy.serving is Serving.LOADED
    assert waiting.serving is Serving.DEFERRED, (waiting.reason, waiting.message)
    assert waiting.reason == "WaitingForRoom"
    assert busy.uid in waiting.message and "EngineError" in waiting.message

"""Every swap-in passes the agent's decider (issue 28, item 3), over fakes of the engine,
Triton's driver and the runtime watch, with the real `Actuator`, `adopt` and `Policy`:

- a client's own swap-in (its `in_use()`) of a model a previous agent held, asked before
  this agent has taken it back, waits for the adoption and is then admitted by the policy:
  the engine is told to swap it in with the victim the policy chose (before, the engine
  swapped it in at once, with no victims and no admission);
- one for a name the agent does not hold is refused with a reason naming the model, at
  once when no adoption runs, and once the adoption ends when one does; the engine is
  never asked to swap it in.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from types import SimpleNamespace
from typing import Any, cast

import pytest

from modelswap_api.control import DesiredEntry
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import EffectivePolicy, effective_policy
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.adoption import adopt
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.loops import RuntimeWatch
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.triton.driver import TritonDriver

MIB = 1 << 20
#: Far above any step of these tests on a loaded machine, far below the test's timeout.
WAIT_SECONDS = 10.0
LOOSE = {"idleAfter": "never", "minResident": "0s"}


def entry_of(name: str, weights_mib: int) -> DesiredEntry:
    spec = {
        "model": {"source": {"uri": "/models/toy"}, "weightsBytes": f"{weights_mib}Mi"},
        "swapPolicy": LOOSE,
    }
    return DesiredEntry(
        uid=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        namespace="ns",
        name=name,
        generation=1,
        spec=ModelDeploymentSpec.from_dict(spec),
        policy=effective_policy(spec, BUILTIN_DEFAULTS).to_status(),
    )


def policy_of(entry: DesiredEntry) -> EffectivePolicy:
    return AgentBackend.policy_of(entry)  # what the agent's adoption is given


class FakeEngine:
    """One 128 MiB GPU; the models it knows, with their states; what it was told to swap
    in, with the victims it was handed. Each model has one live instance (its client
    readopted)."""

    readopt_grace_seconds = 1.0

    def __init__(self) -> None:
        self.states: dict[str, EngineState] = {}
        self.swapped_in: list[tuple[str, list[str]]] = []

    def statuses(self) -> list[Any]:
        return [SimpleNamespace(name=n, state=s) for n, s in self.states.items()]

    def budget(self, ordinal: int) -> Any:
        return SimpleNamespace(budget_bytes=128 * MIB)

    def state(self, name: str) -> EngineState:
        if name not in self.states:
            raise UnknownModel(name)
        return self.states[name]

    def status(self, name: str) -> Any:
        return SimpleNamespace(instances=1 if name in self.states else 0, reason="")

    def gpu_of(self, name: str) -> int:
        if name not in self.states:
            raise UnknownModel(name)
        return 0

    def subscribe(self, listener: Any) -> None:
        pass

    def swap_in(self, name: str, victims: Any = ()) -> None:
        self.swapped_in.append((name, list(victims)))
        for victim in victims:
            self.states[victim] = EngineState.SWAPPED_OUT
        self.states[name] = EngineState.RESIDENT


class FakeDriver:
    def __init__(self, ready: list[str]) -> None:
        self.ready = ready

    async def repository_index(self) -> dict[str, Any]:
        return {name: SimpleNamespace(state="READY") for name in self.ready}


def actuator_on(engine: FakeEngine, *, adopting: bool) -> Actuator:
    return Actuator(
        engine=cast(Engine, engine),
        loader=cast(ModelLoader, None),  # nothing here loads through Triton
        policy=Policy(PolicySettings(), time.monotonic),
        gpu_uuids=("sim-gpu-0",),
        metrics=None,
        adopting=adopting,
    )


def resident(actuator: Actuator, engine: FakeEngine, entry: DesiredEntry) -> AgentModel:
    """A model this agent loaded, resident and idle."""
    model = AgentModel(entry=entry, policy=policy_of(entry), serving=Serving.LOADED, gpu=0)
    model.resident_since_seconds = actuator.clock() - 60.0
    actuator.records[model.uid] = model
    engine.states[model.triton_name] = EngineState.RESIDENT
    return model


def test_a_client_swap_in_during_adoption_waits_for_it_then_passes_admission() -> None:
    engine = FakeEngine()
    actuator = actuator_on(engine, adopting=True)
    big = resident(actuator, engine, entry_of("big", 100))  # leaves no room for the other
    adopted = entry_of("adopted", 32)
    held = AgentModel(entry=adopted, policy=policy_of(adopted))
    engine.states[held.triton_name] = EngineState.SWAPPED_OUT  # in the previous agent's time
    watch = SimpleNamespace(first_ready=asyncio.Event())

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        # the model's client, readopted, asks for it before Triton is ready to adopt
        asked = asyncio.create_task(
            asyncio.to_thread(actuator.decide_client_swap_in, held.triton_name)
        )
        adopting = asyncio.create_task(
            adopt(
                actuator,
                cast(TritonDriver, FakeDriver([held.triton_name])),
                cast(RuntimeWatch, watch),
                saved_entries=lambda: [adopted],
                policy_of=policy_of,
            )
        )
        await asyncio.sleep(0.2)  # time for a swap-in that does not wait to happen
        assert not asked.done()
        assert engine.swapped_in == []  # nothing swapped in while the agent holds no record
        watch.first_ready.set()  # Triton ready: the adoption takes the model back
        assert await asyncio.wait_for(adopting, WAIT_SECONDS) == 1
        await asyncio.wait_for(asked, WAIT_SECONDS)

    asyncio.run(scenario())
    # admitted by the policy: the resident model it chose made room, handed to the engine
    assert engine.swapped_in == [(held.triton_name, [big.triton_name])]
    assert actuator.records[held.uid].serving is Serving.LOADED
    assert not actuator.adopting


def test_a_client_swap_in_of_a_name_the_agent_does_not_hold_is_refused() -> None:
    engine = FakeEngine()
    actuator = actuator_on(engine, adopting=False)
    resident(actuator, engine, entry_of("known", 32))
    stranger = "m-00000000-0000-4000-8000-00000000beef"
    engine.states[stranger] = EngineState.SWAPPED_OUT  # the engine knows it; the agent not

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        with pytest.raises(UnknownModel, match=f"{stranger}.*holds no such model"):
            await asyncio.wait_for(
                asyncio.to_thread(actuator.decide_client_swap_in, stranger), WAIT_SECONDS
            )

    asyncio.run(scenario())
    assert engine.swapped_in == []


def test_an_unknown_name_asked_during_adoption_is_refused_once_adoption_ends() -> None:
    engine = FakeEngine()
    actuator = actuator_on(engine, adopting=True)
    stranger = "m-00000000-0000-4000-8000-00000000beef"
    engine.states[stranger] = EngineState.SWAPPED_OUT

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        asked = asyncio.create_task(asyncio.to_thread(actuator.decide_client_swap_in, stranger))
        await asyncio.sleep(0.2)  # time for an answer that does not wait for the adoption
        assert not asked.done()
        actuator.adoption_ended()  # it took back other models, or none
        with pytest.raises(UnknownModel, match=stranger):
            await asyncio.wait_for(asked, WAIT_SECONDS)

    asyncio.run(scenario())
    assert engine.swapped_in == []

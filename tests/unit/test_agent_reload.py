"""The agent's reload from the source (`Actuator.reload`, what local mode's reload on change
asks for) and its dev models (`ModelLoader` registers one with the engine and never loads
it into Triton; the policy loop never reloads it when no process is attached), over fakes
of the engine, the loader and the driver."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.records import DEV_MODEL, DEV_RUNTIME, AgentModel
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from modelswap_sidecar.sources.resolver import SourceResolver
from modelswap_sidecar.triton.driver import TritonDriver
from modelswap_sidecar.triton.errors import TritonError
from tests.support.agent_fakes import MIB, SPEC, actuator_over, agent_model


class FakeEngine:
    """One 128 MiB GPU; remembers models added and removed."""

    def __init__(self) -> None:
        self.added: list[str] = []
        self.removed: list[str] = []
        self.instances: dict[str, int] = {}
        self.states: dict[str, EngineState] = {}

    def statuses(self) -> list[Any]:
        return [SimpleNamespace(name=n, state=s) for n, s in self.states.items()]

    def budget(self, ordinal: int) -> Any:
        return SimpleNamespace(budget_bytes=128 * MIB)

    def state(self, name: str) -> EngineState:
        if name not in self.added:
            raise UnknownModel(name)
        return self.states.get(name, EngineState.SWAPPED_OUT)

    def status(self, name: str) -> Any:
        return SimpleNamespace(instances=self.instances.get(name, 0), reason="exited")

    def add_model(self, config: Any) -> None:
        self.added.append(config.name)

    def remove_model(self, name: str) -> None:
        self.removed.append(name)


class FakeLoader:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def load(self, model: AgentModel) -> None:
        self.calls.append(("load", model.uid))

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        self.calls.append(("unload", model.uid))

    async def unload_dead(self, model: AgentModel) -> bool:
        self.calls.append(("unload_dead", model.uid))
        return True


def actuator_of(*models: AgentModel) -> tuple[Actuator, FakeEngine, FakeLoader]:
    engine, loader = FakeEngine(), FakeLoader()
    return actuator_over(engine, loader, *models), engine, loader


async def run_loads() -> None:
    """Let the loads a reload started run (tasks on this loop, over the fake loader)."""
    for _ in range(10):
        await asyncio.sleep(0)


async def settle(actuator: Actuator) -> None:
    await run_loads()
    await actuator.close()


def test_a_loaded_model_is_unloaded_and_loaded_again_keeping_or_dropping_its_host_copy() -> None:
    kept, dropped = agent_model("kept", Serving.LOADED), agent_model("dropped", Serving.LOADED)
    actuator, engine, loader = actuator_of(kept, dropped)

    async def scenario() -> None:
        result = await actuator.reload(kept, keep_host_copy=True, why="model.py changed")
        assert (result.outcome, result.reason) == ("completed", "Reloading")
        await run_loads()
        result = await actuator.reload(dropped, keep_host_copy=False, why="weights changed")
        assert result.outcome == "completed"
        await settle(actuator)

    asyncio.run(scenario())
    assert loader.calls == [
        ("unload", kept.uid),
        ("load", kept.uid),
        ("unload", dropped.uid),
        ("load", dropped.uid),
    ]
    assert engine.removed == [dropped.triton_name]  # only the dropped one's host copy
    assert kept.serving is Serving.LOADED and dropped.serving is Serving.LOADED


def test_a_reload_whose_unload_triton_refuses_is_refused_and_changes_nothing() -> None:
    model = agent_model("stuck", Serving.LOADED)
    actuator, engine, loader = actuator_of(model)

    async def refuse(model: AgentModel, *, release_source: bool = True) -> None:
        raise TritonError("Triton refused to unload it: busy")

    loader.unload = refuse  # type: ignore[method-assign]

    async def scenario() -> None:
        result = await actuator.reload(model, keep_host_copy=False, why="weights changed")
        assert (result.outcome, result.reason) == ("refused", "UnloadFailed")
        assert "busy" in (result.message or "")
        await settle(actuator)

    asyncio.run(scenario())
    assert model.serving is Serving.LOADED and engine.removed == [] and loader.calls == []


def test_a_failed_model_is_retried_at_once_and_one_that_holds_nothing_is_unchanged() -> None:
    failed = agent_model("failed", Serving.FAILED)
    failed.failed_at_seconds = time.monotonic()  # its retry would be a minute away
    failed.failed_generation = 1
    loading = agent_model("loading", Serving.LOADING)  # its load reads the files as they are
    dropped = agent_model("dropped", Serving.DROPPED)  # its next swap-in loads from the files
    actuator, engine, loader = actuator_of(failed, loading, dropped)

    async def scenario() -> None:
        assert (await actuator.reload(failed, keep_host_copy=True, why="fixed")).outcome == (
            "completed"
        )
        for model in (loading, dropped):
            result = await actuator.reload(model, keep_host_copy=False, why="x")
            assert result.outcome == "unchanged", result
        await settle(actuator)

    asyncio.run(scenario())
    assert loader.calls == [("load", failed.uid)]  # no unload: Triton held nothing of it
    assert engine.removed == []
    assert failed.serving is Serving.LOADED


def test_a_dev_model_without_a_process_is_never_reloaded_by_the_policy_loop() -> None:
    dev, gone = agent_model("dev", Serving.LOADED), agent_model("gone", Serving.LOADED)
    dev.runtime_backend = DEV_RUNTIME
    actuator, engine, _ = actuator_of(dev, gone)
    engine.added += [dev.triton_name, gone.triton_name]

    async def scenario() -> None:
        assert actuator.reload_gone() == 1  # `gone`'s processes exited; the dev model waits
        assert actuator.reload_all() == 1  # a Triton restart: the dev model is not in it
        await settle(actuator)

    asyncio.run(scenario())
    assert dev.serving is Serving.LOADED


def test_a_dev_models_idle_clock_starts_when_its_process_has_committed() -> None:
    spec = {**SPEC, "swapPolicy": {"idleAfter": "10s", "minResident": "1s"}}
    dev = agent_model("dev", Serving.LOADED, spec=spec)
    dev.runtime_backend = DEV_RUNTIME
    dev.resident_since_seconds = 1.0  # when the loader registered it, long ago
    actuator, engine, _ = actuator_of(dev)
    clock = [100.0]
    actuator.clock = lambda: clock[0]
    actuator.policy = Policy(PolicySettings(), lambda: clock[0])
    engine.added.append(dev.triton_name)

    def idle_swap_outs() -> list[str]:
        actuator.start_dev_clocks()
        return [d.uid for d in actuator.policy.swap_outs(actuator.view())]

    engine.states[dev.triton_name] = EngineState.LOADING  # no process, or not committed
    assert idle_swap_outs() == []  # idle since registered, but nothing to save yet
    assert dev.resident_since_seconds is None
    engine.states[dev.triton_name] = EngineState.RESIDENT  # its process committed
    clock[0] = 150.0
    assert idle_swap_outs() == []
    clock[0] = 159.0
    assert idle_swap_outs() == []
    clock[0] = 161.0
    assert idle_swap_outs() == [dev.uid]  # idleAfter 10 s from the commit


class RecordingDriver:
    def __init__(self) -> None:
        self.calls: list[str] = []

    async def load(self, uid: str, model_dir: Path, parameters: Any) -> str:
        self.calls.append(f"load {uid}")
        return uid

    async def unload(self, uid: str) -> None:
        self.calls.append(f"unload {uid}")


def test_the_loader_registers_a_dev_model_with_the_engine_and_never_loads_it_into_triton() -> None:
    dev = agent_model("dev", Serving.LOADING)
    engine, driver = FakeEngine(), RecordingDriver()
    names: set[str] = {dev.triton_name}
    loader = ModelLoader(
        engine=cast(Engine, engine),
        driver=cast(TritonDriver, driver),
        resolver=cast(SourceResolver, SimpleNamespace()),  # a dev model's source is not read
        socket_path=Path("/run/agent.sock"),
        model_roots={},
        dev_models=lambda: frozenset(names),
    )

    async def scenario() -> None:
        await loader.load(dev)
        await loader.unload(dev)

    asyncio.run(scenario())
    assert engine.added == [dev.triton_name] and driver.calls == []
    assert dev.dev and dev.attaches
    reason, message = dev.loaded_reason()
    assert reason == DEV_MODEL and dev.triton_name in message
    names.clear()  # no longer a dev model: the next load is Triton's
    assert not loader.is_dev(dev)

"""The agent's side of a model process that answers nothing (issue 26, item 6): killed
through the runtime driver and noted for its reload (`ProcessUnresponsive`); where the
agent may not signal it (another uid), Triton is asked to unload the model instead; a
dev-loop process is never killed; the setting `policy.unresponsiveAfterSeconds`."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from modelswap_sidecar.agent.core.records import DEV_RUNTIME
from modelswap_sidecar.agent.core.unresponsive import UnresponsiveRuntimes
from modelswap_sidecar.agent.errors import SettingsError
from modelswap_sidecar.agent.settings.document import settings_from_document
from modelswap_sidecar.engine.heartbeats import Unresponsive, UnresponsiveListener
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.triton.stubs import KillOutcome
from tests.support.agent_documents import settings_document
from tests.support.agent_fakes import agent_model


@dataclass
class FakeEngine:
    listener: UnresponsiveListener | None = None

    def on_unresponsive(self, listener: UnresponsiveListener) -> None:
        self.listener = listener


@dataclass
class FakeLoader:
    unloaded: list[str] = field(default_factory=list)

    async def unload_dead(self, model: Any) -> bool:
        self.unloaded.append(model.uid)
        return True


@dataclass
class FakeActuator:
    records: dict[str, Any]
    engine: FakeEngine = field(default_factory=FakeEngine)
    loader: FakeLoader = field(default_factory=FakeLoader)
    ended_runtimes: dict[str, str] = field(default_factory=dict)
    tasks: list[asyncio.Task[None]] = field(default_factory=list)

    def spawn(self, work: Any, name: str) -> None:
        self.tasks.append(asyncio.create_task(work, name=name))

    @contextlib.asynccontextmanager
    async def _held(self) -> AsyncIterator[None]:
        yield

    def lock_of(self, uid: str) -> Any:
        return self._held()


def report(name: str, pid: int = 777, committed: bool = True) -> Unresponsive:
    return Unresponsive(name, f"{name}_0_0", pid, 21.5, committed, EngineState.RESIDENT)


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def run_with(outcome: KillOutcome, *, dev: bool = False) -> tuple[FakeActuator, list[Any]]:
    model = agent_model("frozen", Serving.LOADED)
    if dev:
        model.runtime_backend = DEV_RUNTIME
    actuator = FakeActuator({model.uid: model})
    kills: list[tuple[int, str]] = []

    def kill(pid: int, name: str) -> KillOutcome:
        kills.append((pid, name))
        return outcome

    async def scenario() -> None:
        runtimes = UnresponsiveRuntimes(actuator, kill)  # type: ignore[arg-type]
        runtimes.listen()
        assert actuator.engine.listener is not None
        # the engine calls from its watcher thread
        await asyncio.to_thread(actuator.engine.listener, report(model.triton_name))
        await settle()
        await asyncio.gather(*actuator.tasks)

    asyncio.run(scenario())
    return actuator, kills


def test_a_silent_stub_is_killed_and_its_reload_says_why() -> None:
    actuator, kills = run_with(KillOutcome.KILLED)
    (uid,) = actuator.records
    assert kills == [(777, actuator.records[uid].triton_name)]
    note = actuator.ended_runtimes[uid]
    assert "pid 777" in note and "answered nothing" in note and "killed" in note
    assert actuator.loader.unloaded == []  # its socket closing does the rest


def test_a_stub_the_agent_may_not_signal_is_unloaded_from_triton() -> None:
    actuator, kills = run_with(KillOutcome.NOT_PERMITTED)
    (uid,) = actuator.records
    assert len(kills) == 1
    assert actuator.loader.unloaded == [uid]
    assert "unloaded from Triton" in actuator.ended_runtimes[uid]


@pytest.mark.parametrize("outcome", [KillOutcome.NOT_A_STUB, KillOutcome.GONE])
def test_nothing_else_is_done_when_no_stub_was_killed(outcome: KillOutcome) -> None:
    actuator, kills = run_with(outcome)
    assert len(kills) == 1
    assert actuator.ended_runtimes == {} and actuator.loader.unloaded == []


def test_a_dev_loop_process_is_never_killed(caplog: pytest.LogCaptureFixture) -> None:
    actuator, kills = run_with(KillOutcome.KILLED, dev=True)
    assert kills == []
    assert actuator.ended_runtimes == {} and actuator.loader.unloaded == []
    assert "was not killed" in caplog.text


def test_the_setting_defaults_to_20_s_takes_0_and_refuses_less_than_two_heartbeats() -> None:
    def parsed(policy: dict[str, Any]) -> float:
        doc = settings_document(policy=policy)
        return settings_from_document(doc).policy.unresponsive_after_seconds

    assert parsed({}) == 20.0
    for value, expected in ((0, 0.0), (10, 10.0), (45.5, 45.5)):
        assert parsed({"unresponsiveAfterSeconds": value}) == expected
    for bad in (5, -1, "soon"):
        with pytest.raises(SettingsError, match=r"policy\.unresponsiveAfterSeconds"):
            parsed({"unresponsiveAfterSeconds": bad})

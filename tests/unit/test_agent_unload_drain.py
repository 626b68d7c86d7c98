"""Every unload from Triton drains the model first, not only a reload (issue 26: Triton's
python backend crashed when a model was unloaded with requests in flight to it), over
fakes of the engine, the loader and the gateway's requests (as in
test_agent_reload_drain.py):

- a removal (`Actuator.unload`: missing from the desired set past the grace period;
  `Actuator.forget`: the control API's DELETE) waits for the request in flight before the
  unload, or ends it at `drainTimeoutSeconds`; a request arriving meanwhile gets the 404 it
  gets once the model is gone (not held), and a model process's own swap-in is refused;
- a drop-style swap-out (a runtime that cannot attach, `onSwapOut: drop` semantics) holds
  new requests (the gateway queues them: `SwappingOut`) and waits for the one in flight
  before the unload, or ends it at the deadline.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import ReloadDrain
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.engine.errors import NoCapacity
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.gateway.errors import UnknownModelError
from modelswap_sidecar.model_states import Serving
from tests.support.agent_fakes import ResidentEngine, actuator_over, agent_model
from tests.support.waiting import until_on_loop

#: Far above any step of these tests on a loaded machine, far below the test's timeout.
WAIT_SECONDS = 10.0
#: How long a test looks for an unload that must not happen yet: a drain that did not wait
#: unloads at once (the next loop turn), far within it.
NOT_YET_SECONDS = 0.2


class FakeLoader:
    """Records Triton's unloads with the model's requests in flight at that moment."""

    def __init__(self, model: AgentModel) -> None:
        self.model = model
        self.calls: list[tuple[str, str]] = []
        #: requests in flight at each unload call
        self.in_flight_at_unload: list[int] = []

    async def load(self, model: AgentModel) -> None:
        self.calls.append(("load", model.uid))

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        self.calls.append(("unload", model.uid))
        self.in_flight_at_unload.append(self.model.active_requests)


class FakeRequests:
    """The gateway's side: queued requests, and what `end` was told (each ended request is
    answered at once)."""

    def __init__(self, model: AgentModel) -> None:
        self.model = model
        self.ended: list[tuple[str, str]] = []

    def queued(self, uid: str) -> int:
        return 0

    def end(self, triton_name: str, why: str) -> int:
        self.ended.append((triton_name, why))
        at_triton = self.model.active_requests
        self.model.active_requests = 0
        return at_triton


def node_of(
    model: AgentModel, *, timeout_seconds: float = WAIT_SECONDS
) -> tuple[Actuator, ResidentEngine, FakeLoader, FakeRequests, AgentDirectory]:
    engine, loader = ResidentEngine(), FakeLoader(model)
    actuator = actuator_over(engine, loader, model)
    requests = FakeRequests(model)
    actuator.drain_reloads_with(
        ReloadDrain(requests=requests, timeout_seconds=timeout_seconds, end_grace_seconds=1.0)
    )
    return actuator, engine, loader, requests, AgentDirectory(actuator)


# -- removal: the grace period's unload and DELETE ------------------------------------------


@pytest.mark.parametrize("how", ["unload", "forget"])
def test_a_removal_unloads_only_once_the_request_in_flight_is_answered(how: str) -> None:
    """`unload`: missing from the set past the grace period; `forget`: DELETE."""
    model = agent_model("toy")
    actuator, engine, loader, requests, directory = node_of(model)

    async def scenario() -> None:
        route = directory.lookup("toy", "ns")
        directory.request_started(route.uid)  # one at Triton
        removal = getattr(actuator, how)
        removing = asyncio.create_task(removal(model))
        await until_on_loop(lambda: not model.desired, "the removal")
        # a request arriving meanwhile gets the removed model's 404, never a queue
        with pytest.raises(UnknownModelError):
            directory.lookup("toy", "ns")
        with pytest.raises(UnknownModelError):
            await directory.ensure_resident(model.uid)
        await asyncio.sleep(NOT_YET_SECONDS)
        assert loader.calls == []  # the request at Triton holds the unload
        assert not removing.done()
        directory.request_finished(route.uid)  # answered: the unload goes on at once
        await asyncio.wait_for(removing, WAIT_SECONDS)
        await actuator.close()

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid)]
    assert loader.in_flight_at_unload == [0]
    assert requests.ended == []
    assert model.serving is Serving.UNLOADED
    if how == "forget":
        assert engine.removed == [model.triton_name]


def test_a_removal_ends_the_request_at_the_deadline_then_unloads() -> None:
    model = agent_model("toy")
    actuator, _engine, loader, requests, _directory = node_of(model, timeout_seconds=0.3)
    model.active_requests = 1  # never answered by itself

    async def scenario() -> None:
        started = time.monotonic()
        await asyncio.wait_for(actuator.unload(model), WAIT_SECONDS)
        assert time.monotonic() - started >= 0.3  # it waited for the drain first
        await actuator.close()

    asyncio.run(scenario())
    assert [name for name, _ in requests.ended] == [model.triton_name]
    why = requests.ended[0][1]
    assert "removed" in why and "drainTimeoutSeconds" in why
    assert loader.calls == [("unload", model.uid)]
    assert loader.in_flight_at_unload == [0]


def test_a_model_processs_own_swap_in_during_a_removals_drain_is_refused() -> None:
    """Its request is one the drain waits for: a swap-in queued on the model's lock behind
    the removal would hold it until the deadline."""
    model = agent_model("toy")
    actuator, engine, loader, _requests, directory = node_of(model)
    engine.states[model.triton_name] = EngineState.SWAPPED_OUT
    directory.request_started(model.uid)

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        removing = asyncio.create_task(actuator.unload(model))
        await until_on_loop(lambda: not model.desired, "the removal")
        with pytest.raises(NoCapacity, match="Removed"):
            await asyncio.to_thread(actuator.decide_client_swap_in, model.triton_name)
        directory.request_finished(model.uid)  # its client got the refusal
        await asyncio.wait_for(removing, WAIT_SECONDS)
        await actuator.close()

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid)]


# -- a drop-style swap-out (a runtime that cannot attach) ----------------------------------


def test_a_drop_swap_out_holds_new_requests_and_unloads_once_the_one_in_flight_is_answered() -> (
    None
):
    model = agent_model("onnx-toy", attaches=False)
    actuator, _engine, loader, requests, directory = node_of(model)

    async def scenario() -> None:
        directory.request_started(model.uid)  # one at Triton
        assert directory.is_resident(model.uid)
        swapping = asyncio.create_task(actuator.swap_out(model, reason="Manual"))
        await until_on_loop(lambda: actuator.held(model.uid), "the hold")
        # new requests are held: the gateway queues them, as for the engine's swap-out
        assert not directory.is_resident(model.uid)
        assert directory.swap_state(model.uid) == "SwappingOut"
        await asyncio.sleep(NOT_YET_SECONDS)
        assert loader.calls == []  # the request at Triton holds the unload
        assert not swapping.done()
        directory.request_finished(model.uid)
        result = await asyncio.wait_for(swapping, WAIT_SECONDS)
        assert (result.outcome, result.reason) == ("completed", "SwappedOut")
        assert not actuator.held(model.uid)
        await actuator.close()

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid)]
    assert loader.in_flight_at_unload == [0]
    assert requests.ended == []
    assert model.serving is Serving.DROPPED


def test_a_drop_swap_out_ends_the_request_at_the_deadline_then_unloads() -> None:
    model = agent_model("onnx-toy", attaches=False)
    actuator, _engine, loader, requests, _directory = node_of(model, timeout_seconds=0.3)
    model.active_requests = 1  # never answered by itself

    async def scenario() -> None:
        result = await asyncio.wait_for(actuator.swap_out(model, reason="Manual"), WAIT_SECONDS)
        assert result.outcome == "completed"
        await actuator.close()

    asyncio.run(scenario())
    assert [name for name, _ in requests.ended] == [model.triton_name]
    why = requests.ended[0][1]
    assert "swapped out" in why and "swaps back in" in why
    assert loader.calls == [("unload", model.uid)]
    assert loader.in_flight_at_unload == [0]
    assert model.serving is Serving.DROPPED

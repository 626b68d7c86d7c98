"""A reload drains its model first and runs once at a time per model (`Actuator.reload`,
`agent.core.reload_drain`, issue 26: Triton crashed when a model was unloaded with requests
in flight), over fakes of the engine, the loader and the gateway's requests.

- while a reload holds the model, the gateway's directory takes it for not resident (new
  requests queue) and its swap-in waits for the reload, then serves;
- requests past the queue are waited for before the unload; queued ones are not;
- past `drainTimeoutSeconds` those at Triton are ended as a swap-out's overdue drain ends
  them, then the unload goes on (after the grace period even if some remain);
- a reload asked while one is under way joins it (one unload, one load); asking to drop
  the host copy makes the one under way drop it, unless it already kept it;
- a model process's own swap-in (a request at Triton for a model swapped out just before
  the reload) waits while the reload drains and is refused once it unloads, so that
  request does not hold Triton's unload (it waited on the lock the reload holds).
"""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import ReloadDrain
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.engine.errors import NoCapacity
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.model_states import Serving
from tests.support.agent_fakes import ResidentEngine, actuator_over, agent_model
from tests.support.waiting import until_on_loop

#: Far above any step of these tests on a loaded machine, far below the test's timeout.
WAIT_SECONDS = 10.0


class FakeLoader:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []
        self.unloading = asyncio.Event()
        self.waits_for: asyncio.Event | None = None

    async def load(self, model: AgentModel) -> None:
        self.calls.append(("load", model.uid))

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        self.calls.append(("unload", model.uid))
        self.unloading.set()
        if self.waits_for is not None:  # Triton's unload waits for a request in the model
            await self.waits_for.wait()


class FakeRequests:
    """The gateway's side: queued requests per uid, and what `end` was told."""

    def __init__(self, model: AgentModel, *, ending_clears: bool = True) -> None:
        self.model = model
        self.waiting = 0
        self.ended: list[tuple[str, str]] = []
        self.ending_clears = ending_clears

    def queued(self, uid: str) -> int:
        return self.waiting if uid == self.model.uid else 0

    def end(self, triton_name: str, why: str) -> int:
        self.ended.append((triton_name, why))
        at_triton = self.model.active_requests - self.waiting
        if self.ending_clears:  # each ended request is answered at once
            self.model.active_requests = self.waiting
        return at_triton


def node_of(
    model: AgentModel,
    *,
    timeout_seconds: float = WAIT_SECONDS,
    grace_seconds: float = WAIT_SECONDS,
    ending_clears: bool = True,
) -> tuple[Actuator, ResidentEngine, FakeLoader, FakeRequests, AgentDirectory]:
    engine, loader = ResidentEngine(), FakeLoader()
    actuator = actuator_over(engine, loader, model)
    requests = FakeRequests(model, ending_clears=ending_clears)
    actuator.drain_reloads_with(
        ReloadDrain(
            requests=requests, timeout_seconds=timeout_seconds, end_grace_seconds=grace_seconds
        )
    )
    return actuator, engine, loader, requests, AgentDirectory(actuator)


async def loaded(actuator: Actuator, model: AgentModel) -> None:
    await until_on_loop(lambda: model.serving is Serving.LOADED, "the reload's load")
    await actuator.close()


def test_a_reload_holds_new_requests_and_unloads_only_once_those_in_flight_are_answered() -> None:
    model = agent_model("toy")
    actuator, _engine, loader, requests, directory = node_of(model)

    async def scenario() -> None:
        directory.request_started(model.uid)  # one at Triton
        assert directory.is_resident(model.uid)
        reloading = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="asked"))
        await until_on_loop(lambda: actuator.held(model.uid), "the hold")
        # new requests are held: the gateway queues them (its swap-in waits for the reload)
        assert not directory.is_resident(model.uid)
        assert directory.swap_state(model.uid) == "Reloading"  # its progress lines say so
        directory.request_started(model.uid)
        requests.waiting = 1
        swap_in = asyncio.create_task(directory.ensure_resident(model.uid))
        await asyncio.sleep(0.2)
        assert loader.calls == []  # the one at Triton holds the unload
        assert not swap_in.done()
        directory.request_finished(model.uid)  # answered: the drain ends at once
        result = await asyncio.wait_for(reloading, WAIT_SECONDS)
        assert (result.outcome, result.reason) == ("completed", "Reloading")
        await asyncio.wait_for(swap_in, WAIT_SECONDS)  # served after the reload, no refusal
        assert directory.is_resident(model.uid) and not actuator.held(model.uid)
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]
    assert requests.ended == []


def test_requests_waiting_in_the_queue_do_not_hold_the_drain() -> None:
    model = agent_model("toy")
    actuator, _engine, loader, requests, _directory = node_of(model)
    model.active_requests = requests.waiting = 3  # all queued (e.g. for an earlier load)

    async def scenario() -> None:
        result = await asyncio.wait_for(
            actuator.reload(model, keep_host_copy=True, why="asked"), WAIT_SECONDS
        )
        assert result.outcome == "completed"
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]
    assert requests.ended == []


def test_past_the_drain_timeout_the_requests_at_triton_are_ended_then_it_unloads() -> None:
    model = agent_model("toy")
    actuator, _engine, loader, requests, _directory = node_of(model, timeout_seconds=0.3)
    model.active_requests = 2  # never answered by themselves

    async def scenario() -> None:
        started = time.monotonic()
        result = await asyncio.wait_for(
            actuator.reload(model, keep_host_copy=True, why="asked"), WAIT_SECONDS
        )
        assert result.outcome == "completed"
        assert time.monotonic() - started >= 0.3  # it waited for the drain first
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert [name for name, _ in requests.ended] == [model.triton_name]
    why = requests.ended[0][1]
    assert "reloaded" in why and "drainTimeoutSeconds" in why
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]


def test_requests_that_outlast_the_grace_period_do_not_stop_the_reload(
    caplog: pytest.LogCaptureFixture,
) -> None:
    model = agent_model("toy")
    actuator, _engine, loader, requests, _directory = node_of(
        model, timeout_seconds=0.2, grace_seconds=0.2, ending_clears=False
    )
    model.active_requests = 1

    async def scenario() -> None:
        result = await asyncio.wait_for(
            actuator.reload(model, keep_host_copy=True, why="asked"), WAIT_SECONDS
        )
        assert result.outcome == "completed"
        await loaded(actuator, model)

    with caplog.at_level(logging.WARNING):
        asyncio.run(scenario())
    assert len(requests.ended) == 1
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]
    assert "still in flight" in caplog.text


def test_a_reload_asked_while_one_is_under_way_joins_it() -> None:
    model = agent_model("toy")
    actuator, engine, loader, _requests, directory = node_of(model)
    directory.request_started(model.uid)  # holds the first reload in its drain

    async def scenario() -> None:
        first = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="one"))
        await until_on_loop(lambda: actuator.held(model.uid), "the hold")
        others = [
            asyncio.create_task(actuator.reload(model, keep_host_copy=keep, why="two"))
            for keep in (True, False, True)
        ]
        await asyncio.sleep(0.1)
        directory.request_finished(model.uid)
        results = await asyncio.wait_for(asyncio.gather(first, *others), WAIT_SECONDS)
        assert [(r.outcome, r.reason) for r in results] == [("completed", "Reloading")] * 4
        assert all("joined the reload under way" in (r.message or "") for r in results[1:])
        await loaded(actuator, model)

    asyncio.run(scenario())
    # one unload and one load; the join that asked to drop the host copy made it drop it
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]
    assert engine.removed == [model.triton_name]


def test_a_drop_asked_after_the_reload_kept_the_host_copy_runs_after_it() -> None:
    model = agent_model("toy")
    actuator, engine, loader, _requests, _directory = node_of(model)

    async def scenario() -> None:
        first = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="one"))
        await asyncio.wait_for(loader.unloading.wait(), WAIT_SECONDS)  # it kept the copy
        second = asyncio.create_task(actuator.reload(model, keep_host_copy=False, why="two"))
        results = await asyncio.wait_for(asyncio.gather(first, second), WAIT_SECONDS)
        assert [r.outcome for r in results] == ["completed", "completed"]
        assert "joined" not in (results[1].message or "")
        await loaded(actuator, model)

    asyncio.run(scenario())
    # the second waited for the first's load, then reloaded with the host copy dropped
    assert loader.calls == [("unload", model.uid), ("load", model.uid)] * 2
    assert engine.removed == [model.triton_name]


def test_without_a_gateway_a_reload_does_not_wait() -> None:
    model = agent_model("toy")
    actuator, _engine, loader, _requests, _directory = node_of(model)
    actuator.reload_drain = None
    model.active_requests = 5

    async def scenario() -> None:
        result = await asyncio.wait_for(
            actuator.reload(model, keep_host_copy=True, why="asked"), WAIT_SECONDS
        )
        assert result.outcome == "completed"
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]


def test_a_caller_that_goes_away_does_not_stop_the_reload() -> None:
    """The control API cancels a handler whose client left: only its wait ends."""
    model = agent_model("toy")
    actuator, _engine, loader, _requests, directory = node_of(model)
    directory.request_started(model.uid)

    async def scenario() -> None:
        caller = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="one"))
        await until_on_loop(lambda: actuator.held(model.uid), "the hold")
        caller.cancel()
        await asyncio.sleep(0.1)
        assert actuator.held(model.uid)  # still draining
        joined = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="two"))
        directory.request_finished(model.uid)
        result = await asyncio.wait_for(joined, WAIT_SECONDS)
        assert (result.outcome, result.reason) == ("completed", "Reloading")
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]


def test_a_client_swap_in_during_a_reload_is_refused_once_it_unloads() -> None:
    model = agent_model("toy")
    actuator, engine, loader, requests, directory = node_of(model, timeout_seconds=0.5)

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        engine.states[model.triton_name] = EngineState.SWAPPED_OUT  # swapped out just before
        directory.request_started(model.uid)  # at Triton, in the model's own swap-in
        loader.waits_for = request_left = asyncio.Event()  # the unload waits for it
        reloading = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="one"))
        await until_on_loop(lambda: actuator.held(model.uid), "the hold")
        # the engine's thread serving the model process's swap-in request
        asked = asyncio.create_task(
            asyncio.to_thread(actuator.decide_client_swap_in, model.triton_name)
        )
        await asyncio.sleep(0.2)
        assert not asked.done() and loader.calls == []  # it waits while the reload drains
        with pytest.raises(NoCapacity, match="Reloading"):
            await asyncio.wait_for(asked, WAIT_SECONDS)
        assert loader.calls == [("unload", model.uid)]  # refused while the unload waits
        request_left.set()  # the model's request failed on the refusal and left Triton
        assert requests.ended  # the drain ended the request at the gateway first
        result = await asyncio.wait_for(reloading, WAIT_SECONDS)
        assert result.outcome == "completed"
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]


def test_a_client_swap_in_of_a_model_resident_again_does_not_wait_behind_a_reload() -> None:
    """The model was swapped out and a request at Triton asked for it; another swap-in
    brought it back while a reload waited for the model's lock: the request goes on at
    once, and so the reload's drain sees it answered (before, its swap-in queued on the
    lock behind the reload, whose unload then waited on it for a minute)."""
    model = agent_model("toy")
    actuator, _engine, loader, requests, _directory = node_of(model)

    async def scenario() -> None:
        actuator.listen(asyncio.get_running_loop())
        async with actuator.lock_of(model.uid):  # a swap-out under way holds it
            reloading = asyncio.create_task(actuator.reload(model, keep_host_copy=True, why="x"))
            await asyncio.sleep(0.05)
            answered = asyncio.to_thread(actuator.decide_client_swap_in, model.triton_name)
            await asyncio.wait_for(answered, WAIT_SECONDS)  # resident: nothing to wait for
        result = await asyncio.wait_for(reloading, WAIT_SECONDS)
        assert result.outcome == "completed"
        await loaded(actuator, model)

    asyncio.run(scenario())
    assert loader.calls == [("unload", model.uid), ("load", model.uid)]
    assert requests.ended == []

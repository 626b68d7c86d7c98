"""A model's removal (the grace period's unload, DELETE) drains and unloads it outside the
control lock (follow-up of issues 26 and 28): while a removed model's request is in
flight, a PUT of the set and a DELETE of another model are answered at once; a PUT that
takes the draining model back is answered `deferred` (`Unloading`), the model is saved as
desired meanwhile and serves again once its unload ends; a DELETE of the model while its
grace unload drains answers once the model is forgotten.

The real `ControlService`, `AgentBackend`, `Actuator` and gateway directory; the engine,
the loader and the gateway's requests are fakes (tests/support/agent_fakes.py), and the
drain waits far longer (`DRAIN_SECONDS`) than any step here, so a PUT or DELETE that
waited for it would be unmistakable: each test asserts that the answer came while the
drain still waited, never a time bound.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from modelswap_api.control import DesiredEntry, DesiredSet, DesiredSetResult, Revision
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.core.reload_drain import ReloadDrain
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.agent.ports.desired_file import load_entries
from modelswap_sidecar.agent.ports.gateway_directory import AgentDirectory
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.gateway.errors import UnknownModelError
from modelswap_sidecar.model_states import Serving
from tests.support.agent_fakes import ResidentEngine, actuator_over, agent_model
from tests.support.waiting import until_on_loop

GRACE_SECONDS = 90.0
#: The removal's drain: far longer than any step of these tests.
DRAIN_SECONDS = 30.0
#: Longest wait for a step (well under the drain, so a step that waited for it fails).
WAIT_SECONDS = 20.0


class Engine(ResidentEngine):
    """Every model resident; no status or host bytes to report (as a restarted agent's)."""

    def status(self, name: str) -> Any:
        raise UnknownModel(name)

    def host_bytes_of(self, name: str) -> int:
        raise UnknownModel(name)


class Loader:
    """Triton's loads and unloads, recorded; each yields to the loop as a real one does."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    async def load(self, model: AgentModel) -> None:
        await asyncio.sleep(0)
        self.calls.append(("load", model.uid))

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        await asyncio.sleep(0)
        self.calls.append(("unload", model.uid))


class Requests:
    """The gateway's side of a drain: nothing queued, nothing ended (no test reaches the
    deadline)."""

    def __init__(self) -> None:
        self.ended: list[str] = []

    def queued(self, uid: str) -> int:
        return 0

    def end(self, triton_name: str, why: str) -> int:
        self.ended.append(triton_name)
        return 0


class Clock:
    """The control service's clock (the grace period), moved by the tests."""

    def __init__(self) -> None:
        self.now_seconds = 1000.0

    def __call__(self) -> float:
        return self.now_seconds


class Node:
    """Models `gone` (to be removed), `kept` and `other`, loaded and desired, under a
    control service over the real backend."""

    def __init__(self, tmp_path: Path) -> None:
        self.gone, self.kept, self.other = (
            agent_model(name, attaches=False) for name in ("gone", "kept", "other")
        )
        self.engine, self.loader, self.requests = Engine(), Loader(), Requests()
        self.actuator: Actuator = actuator_over(
            self.engine, self.loader, self.gone, self.kept, self.other
        )
        self.actuator.drain_reloads_with(
            ReloadDrain(requests=self.requests, timeout_seconds=DRAIN_SECONDS, end_grace_seconds=1)
        )
        self.directory = AgentDirectory(self.actuator)
        self.desired_file = tmp_path / "desired.json"
        self.backend = AgentBackend(
            self.actuator, node_name="node-1", agent_version="test", desired_file=self.desired_file
        )
        (tmp_path / "token").write_text("t")
        settings = ControlSettings(
            node_name="node-1",
            token_file=tmp_path / "token",
            state_file=tmp_path / "revision.json",
            grace_seconds=GRACE_SECONDS,
            unload_check_interval_seconds=3600,  # the tests call unload_due themselves
        )
        self.clock = Clock()
        self.service = ControlService(self.backend, settings, clock=self.clock)
        self.counter = 0

    async def push(self, *models: AgentModel) -> DesiredSetResult:
        self.counter += 1
        entries: Sequence[DesiredEntry] = tuple(m.entry for m in models)
        revision = Revision(term=1, counter=self.counter)
        return await self.service.put_desired(DesiredSet(revision=revision, entries=entries))

    async def draining_gone(self) -> asyncio.Task[tuple[str, ...]]:
        """`gone` dropped from the set past its grace, one request of it at Triton: the
        grace unload's task, once its drain waits."""
        await self.push(self.gone, self.kept, self.other)
        await self.push(self.kept, self.other)
        self.clock.now_seconds += GRACE_SECONDS
        self.directory.request_started(self.gone.uid)  # at Triton, not yet answered
        unloading = asyncio.create_task(self.service.unload_due())
        await until_on_loop(lambda: self.actuator.draining(self.gone.uid), "the drain")
        return unloading

    def answer_the_request(self) -> None:
        self.directory.request_finished(self.gone.uid)

    def saved_uids(self) -> set[str]:
        return {e.uid for e in load_entries(self.desired_file)}

    async def close(self) -> None:
        await self.backend.flush_desired()
        await self.actuator.close()


async def first_done(done: asyncio.Task[Any], drain: asyncio.Task[Any], what: str) -> None:
    """Wait until `done` or the drain's task ends; `done` must end first (the drain waits
    `DRAIN_SECONDS` for a request only the test answers)."""
    await until_on_loop(lambda: done.done() or drain.done(), what, DRAIN_SECONDS * 2)
    assert done.done() and not drain.done(), f"{what} waited for the drain"


@pytest.mark.asyncio
async def test_a_put_is_answered_while_a_removed_model_drains(tmp_path: Path) -> None:
    node = Node(tmp_path)
    try:
        unloading = await node.draining_gone()
        pushing = asyncio.create_task(node.push(node.kept, node.other))
        await first_done(pushing, unloading, "the PUT")
        answer = pushing.result()
        assert {r.uid: r.outcome for r in answer.results} == {
            node.kept.uid: "applied",
            node.other.uid: "applied",
        }
        assert node.loader.calls == []  # the request at Triton still holds the unload
        # meanwhile the removed model answers as gone
        with pytest.raises(UnknownModelError):
            node.directory.lookup("gone", "ns")
        node.answer_the_request()
        assert await asyncio.wait_for(unloading, WAIT_SECONDS) == (node.gone.uid,)
        assert node.loader.calls == [("unload", node.gone.uid)]
        assert node.gone.serving is Serving.UNLOADED and not node.gone.desired
        assert node.saved_uids() == {node.kept.uid, node.other.uid}
        assert node.requests.ended == []
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_delete_of_another_model_is_answered_while_a_removed_model_drains(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    try:
        await node.push(node.gone, node.kept, node.other)
        await node.push(node.kept, node.other)
        node.clock.now_seconds += GRACE_SECONDS
        await node.push(node.kept)  # `other` leaves the set now: not yet due
        node.directory.request_started(node.gone.uid)
        unloading = asyncio.create_task(node.service.unload_due())
        await until_on_loop(lambda: node.actuator.draining(node.gone.uid), "the drain")
        deleting = asyncio.create_task(node.service.delete(node.other.uid))
        await first_done(deleting, unloading, "the DELETE")
        result = deleting.result()
        assert (result.outcome, result.reason) == ("completed", "Forgotten")
        assert node.other.uid not in node.actuator.records
        assert node.engine.removed == [node.other.triton_name]
        # `gone` left the backend's desired entries when its unload began: a restart now
        # does not bring it back
        assert node.saved_uids() == {node.kept.uid}
        node.answer_the_request()
        assert await asyncio.wait_for(unloading, WAIT_SECONDS) == (node.gone.uid,)
        assert node.saved_uids() == {node.kept.uid}
        assert [m.uid for m in await node.service.models()] == sorted(
            [node.gone.uid, node.kept.uid]
        )
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_put_taking_the_draining_model_back_has_it_serve_again(tmp_path: Path) -> None:
    node = Node(tmp_path)
    try:
        unloading = await node.draining_gone()
        pushing = asyncio.create_task(node.push(node.gone, node.kept, node.other))
        await first_done(pushing, unloading, "the PUT")
        outcomes = {r.uid: (r.outcome, r.reason) for r in pushing.result().results}
        assert outcomes[node.gone.uid] == ("deferred", "Unloading")
        assert pushing.result().pending_unloads == ()
        # a restart now takes it back: it is saved as desired while its unload runs
        assert node.saved_uids() == {node.gone.uid, node.kept.uid, node.other.uid}
        node.answer_the_request()
        # the unload it was in goes on, and it is taken back once it ends
        assert await asyncio.wait_for(unloading, WAIT_SECONDS) == ()
        await until_on_loop(lambda: node.gone.serving is Serving.LOADED, "its load", WAIT_SECONDS)
        assert node.loader.calls == [("unload", node.gone.uid), ("load", node.gone.uid)]
        assert node.gone.desired and node.actuator.records[node.gone.uid] is node.gone
        assert node.directory.lookup("gone", "ns").uid == node.gone.uid  # served again
        assert node.saved_uids() == {node.gone.uid, node.kept.uid, node.other.uid}
        (info,) = [m for m in await node.service.models() if m.uid == node.gone.uid]
        assert info.desired and info.unload_in_seconds is None
        # nothing left to unload: the next check does nothing
        node.clock.now_seconds += GRACE_SECONDS
        assert await node.service.unload_due() == ()
        assert node.gone.serving is Serving.LOADED
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_delete_of_the_model_its_grace_unload_drains(tmp_path: Path) -> None:
    """The DELETE waits for the drain (it answers once the model is forgotten), without
    holding the control lock: a PUT meanwhile is answered at once."""
    node = Node(tmp_path)
    try:
        unloading = await node.draining_gone()
        deleting = asyncio.create_task(node.service.delete(node.gone.uid))
        await asyncio.sleep(0.05)  # the DELETE is under way, waiting for the drain
        pushing = asyncio.create_task(node.push(node.kept, node.other))
        await first_done(pushing, unloading, "the PUT")
        assert not deleting.done()
        node.answer_the_request()
        assert await asyncio.wait_for(unloading, WAIT_SECONDS) == (node.gone.uid,)
        result = await asyncio.wait_for(deleting, WAIT_SECONDS)
        assert (result.outcome, result.reason) == ("completed", "Forgotten")
        assert node.gone.uid not in node.actuator.records
        assert node.engine.removed == [node.gone.triton_name]
        assert node.loader.calls == [("unload", node.gone.uid)]
        assert node.saved_uids() == {node.kept.uid, node.other.uid}
        assert node.gone.uid not in [m.uid for m in await node.service.models()]
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_set_dropping_the_taken_back_model_again_lets_the_removal_stand(
    tmp_path: Path,
) -> None:
    node = Node(tmp_path)
    try:
        unloading = await node.draining_gone()
        back = await asyncio.wait_for(node.push(node.gone, node.kept, node.other), WAIT_SECONDS)
        assert {r.uid: r.reason for r in back.results}[node.gone.uid] == "Unloading"
        await asyncio.wait_for(node.push(node.kept, node.other), WAIT_SECONDS)
        assert node.saved_uids() == {node.kept.uid, node.other.uid}
        node.answer_the_request()
        assert await asyncio.wait_for(unloading, WAIT_SECONDS) == (node.gone.uid,)
        assert node.loader.calls == [("unload", node.gone.uid)]  # not loaded again
        assert node.gone.serving is Serving.UNLOADED and not node.gone.desired
        assert node.saved_uids() == {node.kept.uid, node.other.uid}
        (info,) = [m for m in await node.service.models() if m.uid == node.gone.uid]
        assert not info.desired and info.unload_in_seconds is None
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_a_put_taking_a_model_back_while_its_delete_drains(tmp_path: Path) -> None:
    """The DELETE answers once the model is forgotten, as asked; the set that took it back
    meanwhile has it placed and loaded anew after that."""
    node = Node(tmp_path)
    try:
        await node.push(node.gone, node.kept, node.other)
        await node.push(node.kept, node.other)  # `gone` in its grace period, still loaded
        node.directory.request_started(node.gone.uid)
        deleting = asyncio.create_task(node.service.delete(node.gone.uid))
        await until_on_loop(lambda: node.actuator.draining(node.gone.uid), "the drain")
        pushing = asyncio.create_task(node.push(node.gone, node.kept, node.other))
        await first_done(pushing, deleting, "the PUT")
        outcomes = {r.uid: (r.outcome, r.reason) for r in pushing.result().results}
        assert outcomes[node.gone.uid] == ("deferred", "Unloading")
        assert node.saved_uids() == {node.gone.uid, node.kept.uid, node.other.uid}
        node.answer_the_request()
        result = await asyncio.wait_for(deleting, WAIT_SECONDS)
        assert (result.outcome, result.reason) == ("completed", "Forgotten")
        assert node.engine.removed == [node.gone.triton_name]
        again = await until_on_loop(
            lambda: (
                (m := node.actuator.records.get(node.gone.uid)) is not None
                and m.serving is Serving.LOADED
                and m
            ),
            "its load anew",
            WAIT_SECONDS,
        )
        assert again is not node.gone and again.desired  # a new record: the old was forgotten
        assert node.loader.calls == [("unload", node.gone.uid), ("load", node.gone.uid)]
        assert node.saved_uids() == {node.gone.uid, node.kept.uid, node.other.uid}
    finally:
        await node.close()

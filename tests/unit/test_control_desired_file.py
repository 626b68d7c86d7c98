"""The agent's saved desired entries (`desired.json`) through the control service: saved
once per change, never with the control lock held across the write, in the order the
snapshots were taken, and a DELETE takes the model off the saved set (issue 26, item 8).

The real `ControlService`, `AgentBackend` and `Actuator`; the engine, loader and clock are
stand-ins, and the records start as a restarted agent's would (loaded, desired), so no
model is placed or loaded. Writes go through an injected writer that counts them and can
hold one at a barrier.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from modelswap_api.control import DesiredEntry, DesiredSet, Revision
from modelswap_api.defaults import BUILTIN_DEFAULTS
from modelswap_api.models import ModelDeploymentSpec
from modelswap_api.policy import effective_policy
from modelswap_sidecar.agent.core.actuator import Actuator
from modelswap_sidecar.agent.core.loading import ModelLoader
from modelswap_sidecar.agent.core.records import AgentModel
from modelswap_sidecar.agent.ports.backend import AgentBackend
from modelswap_sidecar.agent.ports.desired_file import load_entries, save_entries
from modelswap_sidecar.control.app import make_app
from modelswap_sidecar.control.auth import TokenFile
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from modelswap_sidecar.engine.core import Engine
from modelswap_sidecar.engine.errors import UnknownModel
from modelswap_sidecar.model_states import Serving
from modelswap_sidecar.policy.facade import Policy
from modelswap_sidecar.policy.inputs import PolicySettings
from tests.support.waiting import until_on_loop

GRACE_SECONDS = 90.0
SPEC = {"model": {"source": {"uri": "/models/mlp"}, "weightsBytes": "32Mi"}}
POLICY = effective_policy(SPEC, BUILTIN_DEFAULTS)
#: Longest a test waits for a condition (a write held at the barrier is released by then).
WAIT_SECONDS = 20.0


class NoEngine:
    """An engine that holds nothing: reports find no status and no host bytes."""

    def status(self, name: str) -> Any:
        raise UnknownModel(name)

    def host_bytes_of(self, name: str) -> int:
        raise UnknownModel(name)

    def remove_model(self, name: str) -> None:
        raise UnknownModel(name)


class UnloadingLoader:
    """Unloads at once, counting; yields to the loop once, as a real unload (awaiting
    Triton) does."""

    def __init__(self) -> None:
        self.unloaded: list[str] = []

    async def unload(self, model: AgentModel, *, release_source: bool = True) -> None:
        await asyncio.sleep(0)
        self.unloaded.append(model.uid)


class CountingWriter:
    """`save_entries`, counted; once `hold` is set the next write waits at a barrier
    (a thread, as the real write runs) until `release` is set."""

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.hold = False
        self.entered = threading.Event()
        self.release = threading.Event()
        self._lock = threading.Lock()

    def __call__(self, path: Path, entries: Sequence[DesiredEntry]) -> None:
        with self._lock:
            held, self.hold = self.hold, False
        if held:
            self.entered.set()
            assert self.release.wait(WAIT_SECONDS), "the held write was never released"
        save_entries(path, entries)
        with self._lock:
            self.sizes.append(len(entries))

    @property
    def writes(self) -> int:
        with self._lock:
            return len(self.sizes)


class Clock:
    def __init__(self) -> None:
        self.now_seconds = 1000.0

    def __call__(self) -> float:
        return self.now_seconds


def desired_entry(index: int, generation: int = 1) -> DesiredEntry:
    return DesiredEntry(
        uid=str(uuid.UUID(int=index + 1, version=4)),
        namespace="ns",
        name=f"m{index}",
        generation=generation,
        spec=ModelDeploymentSpec.from_dict(SPEC),
        policy=POLICY.to_status(),
    )


class Node:
    """A restarted agent holding `count` loaded models, its control service over them."""

    def __init__(self, tmp_path: Path, count: int, writer: Any = save_entries) -> None:
        self.entries = [desired_entry(i) for i in range(count)]
        records = {
            e.uid: AgentModel(entry=e, policy=POLICY, serving=Serving.LOADED, attaches=False)
            for e in self.entries
        }
        self.loader = UnloadingLoader()
        self.actuator = Actuator(
            engine=cast(Engine, NoEngine()),
            loader=cast(ModelLoader, self.loader),
            policy=Policy(PolicySettings(), time.monotonic),
            gpu_uuids=("g0",),
            metrics=None,
            records=records,
        )
        self.desired_file = tmp_path / "state" / "desired.json"
        self.backend = AgentBackend(
            self.actuator,
            node_name="node-1",
            agent_version="test",
            desired_file=self.desired_file,
            write_desired=writer,
        )
        self.clock = Clock()
        self.token_file = tmp_path / "token"
        self.token_file.write_text("t")
        settings = ControlSettings(
            node_name="node-1",
            token_file=self.token_file,
            state_file=tmp_path / "state" / "revision.json",
            grace_seconds=GRACE_SECONDS,
            unload_check_interval_seconds=3600,  # the tests call unload_due themselves
        )
        self.service = ControlService(self.backend, settings, clock=self.clock)
        self.counter = 0

    async def push(self, entries: Sequence[DesiredEntry]) -> None:
        self.counter += 1
        revision = Revision(term=1, counter=self.counter)
        await self.service.put_desired(DesiredSet(revision=revision, entries=tuple(entries)))

    def saved_uids(self) -> set[str]:
        """What a restarted agent takes back (`running.run` and adoption read this)."""
        return {e.uid for e in load_entries(self.desired_file)}

    async def close(self) -> None:
        await self.backend.flush_desired()
        await self.actuator.close()


@pytest.mark.asyncio
async def test_a_large_set_shrinking_to_a_few_is_saved_once_not_per_unload(
    tmp_path: Path,
) -> None:
    """4,096 entries shrinking to 10 rewrote the whole file on each of 4,086 unloads (3.7 GB
    in 17 min, with the control lock held). 300 entries here: the count does not depend
    on the size, so the test stays fast."""
    writer = CountingWriter()
    node = Node(tmp_path, 300, writer)
    try:
        await node.push(node.entries)
        await node.push(node.entries[:10])
        assert writer.sizes == [300, 300]  # dropped entries stay saved through their grace
        node.clock.now_seconds += GRACE_SECONDS
        unloaded = await node.service.unload_due()
        assert len(unloaded) == 290 and len(node.loader.unloaded) == 290
        assert writer.sizes == [300, 300, 10]  # one write for the whole batch
        assert node.saved_uids() == {e.uid for e in node.entries[:10]}
        assert await node.service.unload_due() == ()
        assert writer.writes == 3  # nothing unloaded, nothing written
    finally:
        await node.close()


@pytest.mark.asyncio
async def test_the_control_lock_is_not_held_while_the_file_is_written(tmp_path: Path) -> None:
    """While the batch's write is held at a barrier, a DELETE and a PUT still take the
    lock and act; the two later snapshots are written once, after the held one, and the
    file ends with the newest (an older snapshot never lands over a newer one)."""
    writer = CountingWriter()
    node = Node(tmp_path, 20, writer)
    kept, dropped = node.entries[:3], node.entries[3:]
    try:
        await node.push(node.entries)
        await node.push(kept)
        node.clock.now_seconds += GRACE_SECONDS
        writer.hold = True
        unloading = asyncio.create_task(node.service.unload_due())
        await until_on_loop(writer.entered.is_set, "the batch's write to start", WAIT_SECONDS)

        forgotten = dropped[0].uid
        deleting = asyncio.create_task(node.service.delete(forgotten))
        await until_on_loop(
            lambda: forgotten not in node.actuator.records, "the DELETE to act", WAIT_SECONDS
        )
        newer = desired_entry(0, generation=2)
        pushing = asyncio.create_task(node.push([newer, *kept[1:]]))
        await until_on_loop(
            lambda: node.actuator.records[newer.uid].entry.generation == 2,
            "the PUT to act",
            WAIT_SECONDS,
        )
        # Both acted while the first write is still held: the lock was free.
        assert not unloading.done() and writer.writes == 2
        # Their answers wait for their own snapshot, which is behind the held write.
        assert not deleting.done() and not pushing.done()

        writer.release.set()
        assert len(await unloading) == 17
        assert (await deleting).reason == "Forgotten"
        await pushing
        assert writer.sizes == [20, 20, 3, 3]  # the DELETE's and PUT's snapshots: one write
        saved = {e.uid: e.generation for e in load_entries(node.desired_file)}
        assert saved == {newer.uid: 2, **{e.uid: 1 for e in kept[1:]}}
    finally:
        writer.release.set()
        await node.close()


@pytest.mark.asyncio
async def test_a_deleted_model_stays_deleted_after_an_agent_restart(tmp_path: Path) -> None:
    """DELETE during the grace period (the operator's finalizer does not wait for it) did
    not rewrite desired.json: the restarted agent took the model back."""
    node = Node(tmp_path, 2)
    gone, kept = node.entries
    try:
        await node.push(node.entries)
        await node.push([kept])
        assert node.saved_uids() == {gone.uid, kept.uid}  # in its grace: still held
        assert (await node.service.delete(gone.uid)).reason == "Forgotten"
        assert node.saved_uids() == {kept.uid}
    finally:
        await node.close()
    # The restarted agent, on the same state folder: its records are what it saved (as
    # `running.run` and `adopt` take them back).
    restarted = Node(tmp_path, 0)
    try:
        for saved in load_entries(restarted.desired_file):
            restarted.actuator.records[saved.uid] = AgentModel(
                entry=saved, policy=POLICY, serving=Serving.LOADED, attaches=False
            )
        assert [m.uid for m in await restarted.service.models()] == [kept.uid]
    finally:
        await restarted.close()


@pytest.mark.asyncio
async def test_a_failed_save_is_a_503_and_a_retried_delete_saves(tmp_path: Path) -> None:
    """The write's failure is the client's answer (503 DesiredStoreUnavailable, the model
    is forgotten all the same); the retried DELETE, with nothing left to forget, still
    takes the uid off the saved set."""
    failing = [True]

    def flaky(path: Path, entries: Sequence[DesiredEntry]) -> None:
        if failing[0]:
            raise OSError(28, "No space left on device")
        save_entries(path, entries)

    node = Node(tmp_path, 2, flaky)
    gone, kept = node.entries
    app = make_app(node.service, TokenFile(node.token_file))
    auth = {"Authorization": "Bearer t"}
    try:
        failing[0] = False
        await node.push(node.entries)
        await node.push([kept])
        failing[0] = True
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            response = await client.delete(f"/v1/models/{gone.uid}", headers=auth)
            body = await response.json()
            assert (response.status, body["reason"]) == (503, "DesiredStoreUnavailable")
            assert "No space left" in body["message"]
            assert gone.uid not in node.actuator.records
            assert node.saved_uids() == {gone.uid, kept.uid}  # the failed write changed nothing
            failing[0] = False
            response = await client.delete(f"/v1/models/{gone.uid}", headers=auth)
            assert (response.status, (await response.json())["reason"]) == (200, "NotHeld")
        assert node.saved_uids() == {kept.uid}
    finally:
        await node.close()


def test_a_saved_entry_past_the_generation_bound_is_not_taken_back(tmp_path: Path) -> None:
    """An agent before the bound may have saved generation 2^70: taken back, every later
    push of that uid would be `stale`. It is left out (logged); the others are taken."""
    path = tmp_path / "desired.json"
    huge = dataclasses.replace(desired_entry(0), generation=2**70)
    save_entries(path, [huge, desired_entry(1)])
    assert [e.uid for e in load_entries(path)] == [desired_entry(1).uid]

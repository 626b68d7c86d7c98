"""A restarted agent's control service: until the operator's first push, which models are
desired is the backend's word (the agent takes its last desired entries back from disk),
so held models are reported desired and cannot be deleted; the first push decides after."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest

from modelswap_api.control import DesiredEntry, DesiredSet, EntryResult, ModelInfo
from modelswap_sidecar.control.errors import RefusedError
from modelswap_sidecar.control.service import ControlService
from modelswap_sidecar.control.settings import ControlSettings
from tests.support.agent_harness import entry

pytestmark = pytest.mark.asyncio


class HeldBackend:
    """What a restarted agent holds: `desired` as its own records say."""

    def __init__(self, held: dict[str, bool]) -> None:
        self.held = dict(held)
        self.forgotten: list[str] = []

    async def models(self) -> Sequence[ModelInfo]:
        return [
            ModelInfo(
                uid=uid,
                namespace="default",
                name=uid,
                state="Resident",
                phase="Resident",
                generation=1,
                desired=desired,
            )
            for uid, desired in self.held.items()
        ]

    async def converge(self, entries: Sequence[DesiredEntry]) -> Sequence[EntryResult]:
        for e in entries:
            self.held[e.uid] = True
        return [EntryResult(uid=e.uid, outcome="applied", reason="Updated") for e in entries]

    async def forget(self, uid: str) -> bool:
        self.forgotten.append(uid)
        return self.held.pop(uid, None) is not None

    def save_desired(self) -> asyncio.Future[None]:
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


def service(backend: HeldBackend, tmp_path: Path) -> ControlService:
    settings = ControlSettings(
        node_name="node-a", token_file=tmp_path / "token", state_file=tmp_path / "revision.json"
    )
    return ControlService(backend, settings, clock=lambda: 0.0)  # type: ignore[arg-type]


async def test_before_the_first_push_the_backend_says_what_is_desired(tmp_path: Path) -> None:
    backend = HeldBackend({"kept": True, "dropped": False})
    control = service(backend, tmp_path)
    assert {m.uid: m.desired for m in await control.models()} == {"kept": True, "dropped": False}
    with pytest.raises(RefusedError, match="in the desired set"):
        await control.delete("kept")
    assert (await control.delete("dropped")).outcome == "completed"
    assert backend.forgotten == ["dropped"]


async def test_after_the_first_push_the_set_decides(tmp_path: Path) -> None:
    backend = HeldBackend({"kept": True, "other": True})
    control = service(backend, tmp_path)
    pushed = DesiredSet.from_dict({"revision": {"term": 1, "counter": 1},
                                   "entries": [entry("other", name="other")]})  # fmt: skip
    await control.put_desired(pushed)
    assert {m.uid: m.desired for m in await control.models()} == {"kept": False, "other": True}
    assert (await control.delete("kept")).outcome == "completed"

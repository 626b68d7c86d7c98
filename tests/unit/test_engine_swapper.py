"""The swapper alone, in-process: a fake engine (the `swaps.Engine` Protocol: real sim
allocator, host store and budget, no threads of its own) and a fake transport to the
clients (each instance's peer answers from a script). No processes, no sockets."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import ErrorCode, Message, Op, RegionKind, error_reply, reply_to
from modelswap_sidecar.allocators.base import Allocator
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.budget import HbmBudget
from modelswap_sidecar.engine.errors import ClientFailed, NoCapacity, UnknownModel
from modelswap_sidecar.engine.events import MAKE_ROOM, SwapEvent, SwapKind
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.records import (
    InstanceRecord,
    ModelConfig,
    ModelRecord,
    RegionRecord,
)
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState, check_transition
from modelswap_sidecar.engine.swaps import Swapper

MIB = 1 << 20
S = EngineState


class FakeReply:
    def __init__(self, message: Message) -> None:
        self.message = message

    def wait(self, timeout_seconds: float | None = None) -> Message:
        return self.message


class FakePeer:
    """One client: records each request; `refuse` names ops it answers with an error."""

    def __init__(self, refuse: set[Op] | None = None) -> None:
        self.ops: list[Op] = []
        self.refuse = refuse or set()
        self.closed = False

    def request_start(
        self, op: Op, body: dict[str, Any] | None = None, epoch: int = 0, fds: Any = None
    ) -> FakeReply:
        self.ops.append(op)
        request = Message(op, len(self.ops), epoch, body or {})
        if op in self.refuse:
            return FakeReply(error_reply(request, epoch, ErrorCode.INTERNAL, f"{op} refused"))
        return FakeReply(reply_to(request, epoch, {}))

    def close(self) -> None:
        self.closed = True


class FakeEngine:
    """What `Swapper` needs of an engine, and nothing else."""

    def __init__(self, tmp: Path, budget_bytes: int) -> None:
        self.allocator: Allocator = SimAllocator(capacities_bytes=[64 * MIB], prefill=False)
        self.store = HostStore(tmp / "store", {0: 256 * MIB})
        self.settings = EngineSettings()
        self.budgets = {0: HbmBudget(0, budget_bytes)}
        self.checkpoint: Callable[[str], None] = lambda name: None
        self.models: dict[str, ModelRecord] = {}
        self.events: list[SwapEvent] = []
        self.writes = 0

    def model(self, name: str) -> ModelRecord:
        if name not in self.models:
            raise UnknownModel(name)
        return self.models[name]

    def set_state(
        self, m: ModelRecord, state: EngineState, reason: str = "", *, persist: bool = True
    ) -> None:
        check_transition(m.state, state)
        m.state = state

    def persist(self) -> None:
        self.writes += 1

    def close_fd(self, fd: int) -> None:
        os.close(fd)

    def emit(self, event: SwapEvent) -> None:
        self.events.append(event)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[FakeEngine]:
    e = FakeEngine(tmp_path, 12 * MIB)
    yield e
    e.allocator.close()


def resident(engine: FakeEngine, swapper: Swapper, name: str, peer: FakePeer) -> ModelRecord:
    """A resident model of one instance: an 8 MiB weight region (mapped, its host copy
    committed), as an attach leaves it."""
    m = engine.models[name] = ModelRecord(ModelConfig(name, 0), S.RESIDENT)
    region = RegionRecord("w", 8 * MIB, RegionKind.WEIGHTS, address=0)
    relpath = engine.store.relpath(0, name, "0", "w", "weights")
    region.weights_file = engine.store.commit(engine.store.stage(0, relpath, 8 * MIB))
    region.chunks = swapper.allocate(m, 8 * MIB)
    m.instances["0"] = InstanceRecord(
        "0",
        {"w": region},
        peer=cast(Any, peer),
        mapped=True,
        committed=True,
    )
    return m


def used(engine: FakeEngine) -> int:
    return engine.budgets[0].view().used_bytes


def test_swap_out_then_in_talks_to_the_client_and_moves_the_budget(engine: FakeEngine) -> None:
    swapper = Swapper(engine)
    peer = FakePeer()
    m = resident(engine, swapper, "a", peer)
    assert used(engine) == 8 * MIB
    swapper.swap_out_locked(m, "idle", cause="Idle")
    assert m.state is S.SWAPPED_OUT and used(engine) == 0
    assert peer.ops == [Op.QUIESCE, Op.UNMAP]
    swapper.swap_in_locked(m)
    assert m.state is S.RESIDENT and used(engine) == 8 * MIB
    assert peer.ops[2:] == [Op.MAP, Op.RESTORE]
    assert [(e.kind, e.cause) for e in engine.events] == [(SwapKind.OUT, "Idle"), (SwapKind.IN, "")]
    assert all(e.seconds > 0 for e in engine.events)
    assert (m.swap_ins, m.swap_outs) == (1, 1)


def test_a_map_the_client_refuses_rolls_back_to_swapped_out(engine: FakeEngine) -> None:
    swapper = Swapper(engine)
    peer = FakePeer()
    m = resident(engine, swapper, "a", peer)
    swapper.swap_out_locked(m)
    peer.refuse = {Op.MAP}
    with pytest.raises(ClientFailed, match="refused"):
        swapper.swap_in_locked(m)
    assert m.state is S.SWAPPED_OUT and used(engine) == 0
    assert not m.instances["0"].mapped and m.instances["0"].regions["w"].chunks == []
    assert [e.kind for e in engine.events] == [SwapKind.OUT]  # no swap-in announced


def test_room_is_made_only_from_the_victims_given(engine: FakeEngine) -> None:
    swapper = Swapper(engine)
    b = resident(engine, swapper, "b", FakePeer())
    swapper.swap_out_locked(b)  # b: 8 MiB to bring back; a holds the room of a 12 MiB budget
    a = resident(engine, swapper, "a", FakePeer())
    engine.events.clear()
    with pytest.raises(NoCapacity, match="0 victim"):
        swapper.swap_in_locked(b)  # the engine chooses nobody
    assert a.state is S.RESIDENT and b.state is S.SWAPPED_OUT
    swapper.swap_in_locked(b, victims=["gone", "a"])  # an unknown name is skipped
    assert a.state is S.SWAPPED_OUT and b.state is S.RESIDENT
    assert [(e.model, e.kind, e.cause) for e in engine.events] == [
        ("a", SwapKind.OUT, MAKE_ROOM),
        ("b", SwapKind.IN, ""),
    ]
    assert used(engine) == 8 * MIB

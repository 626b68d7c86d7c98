"""The swapper alone, in-process: the real model table, GPU ledger (sim allocator) and
host store, and a fake transport to the clients that answers each request from a script.
No processes, no sockets, no threads."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import (
    ConnectionLost,
    ErrorCode,
    Message,
    Op,
    RegionKind,
    error_reply,
    reply_to,
)
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.errors import ClientFailed, NoCapacity, UnknownModel
from modelswap_sidecar.engine.events import MAKE_ROOM, SwapEvent, SwapEvents, SwapKind
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import (
    InstanceRecord,
    ModelConfig,
    ModelRecord,
    RegionRecord,
)
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.table import ModelTable

MIB = 1 << 20
S = EngineState


@dataclass
class Connected:
    """Stands for an instance's socket: the record reads `closed` for liveness."""

    closed: bool = False


class FakeReply:
    def __init__(self, message: Message) -> None:
        self.message = message

    def wait(self, timeout_seconds: float | None = None) -> Message:
        return self.message


@dataclass
class FakeTransport:
    """Every client answers ok, except the (instance, op) pairs in `refuse` (an error
    reply); `ops` records what each instance was sent, in order."""

    refuse: set[tuple[str, Op]] = field(default_factory=set)
    ops: dict[str, list[Op]] = field(default_factory=dict)

    def start(
        self, inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: Any
    ) -> FakeReply:
        if inst.peer is None or inst.peer.closed:
            raise ConnectionLost("not connected")
        sent = self.ops.setdefault(inst.name, [])
        sent.append(op)
        request = Message(op, len(sent), epoch, body)
        if (inst.name, op) in self.refuse:
            return FakeReply(error_reply(request, epoch, ErrorCode.INTERNAL, f"{op} refused"))
        return FakeReply(reply_to(request, epoch, {}))

    def disconnect(self, inst: InstanceRecord) -> None:
        if inst.peer is not None:
            cast(Connected, inst.peer).closed = True


@dataclass
class Parts:
    table: ModelTable
    ledger: GpuLedger
    store: HostStore
    transport: FakeTransport
    swapper: Swapper
    events: list[SwapEvent]


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    """A 12 MiB GPU, a 256 MiB host store."""
    allocator = SimAllocator(capacities_bytes=[12 * MIB], prefill=False)
    store = HostStore(tmp_path / "store", {0: 256 * MIB})
    table = ModelTable(store)
    ledger = GpuLedger(allocator, table, EngineSettings())
    transport = FakeTransport()
    events = SwapEvents()
    seen: list[SwapEvent] = []
    events.subscribe(seen.append)
    swapper = Swapper(
        table=table,
        ledger=ledger,
        transport=transport,
        store=store,
        settings=EngineSettings(),
        events=events,
        checkpoint=lambda name: None,
    )
    yield Parts(table, ledger, store, transport, swapper, seen)
    allocator.close()


def resident(p: Parts, name: str, instances: int = 1, region_bytes: int = 8 * MIB) -> ModelRecord:
    """A resident model whose instances each map one weight region (its host copy
    committed), as an attach leaves it."""
    p.table.add(ModelConfig(name, 0))
    m = p.table.get(name)
    m.state = S.RESIDENT
    for n in range(instances):
        region = RegionRecord("w", region_bytes, RegionKind.WEIGHTS, address=0)
        relpath = p.store.relpath(0, name, str(n), "w", "weights")
        region.weights_file = p.store.commit(p.store.stage(0, relpath, region_bytes))
        region.chunks = p.ledger.allocate(0, region_bytes)
        m.instances[str(n)] = InstanceRecord(
            str(n), {"w": region}, peer=cast(Any, Connected()), mapped=True, committed=True
        )
    return m


def used(p: Parts) -> int:
    return p.ledger.view(0).used_bytes


def test_swap_out_then_in_talks_to_the_client_and_moves_the_budget(parts: Parts) -> None:
    m = resident(parts, "a")
    assert used(parts) == 8 * MIB
    parts.swapper.swap_out_locked(m, "idle", cause="Idle")
    assert m.state is S.SWAPPED_OUT and used(parts) == 0
    assert parts.transport.ops["0"] == [Op.QUIESCE, Op.UNMAP]
    parts.swapper.swap_in_locked(m)
    assert m.state is S.RESIDENT and used(parts) == 8 * MIB
    assert parts.transport.ops["0"][2:] == [Op.MAP, Op.RESTORE]
    assert [(e.kind, e.cause) for e in parts.events] == [(SwapKind.OUT, "Idle"), (SwapKind.IN, "")]
    assert all(e.seconds > 0 for e in parts.events)
    assert (m.swap_ins, m.swap_outs) == (1, 1)


def test_a_model_of_two_instances_swaps_out_and_in_on_both(parts: Parts) -> None:
    m = resident(parts, "a", instances=2, region_bytes=4 * MIB)
    assert used(parts) == 8 * MIB
    parts.swapper.swap_out_locked(m, "idle")
    assert m.state is S.SWAPPED_OUT and used(parts) == 0
    assert not any(i.mapped for i in m.instances.values())
    parts.swapper.swap_in_locked(m)
    assert m.state is S.RESIDENT and used(parts) == 8 * MIB
    assert all(i.mapped and i.chunk_bytes() == 4 * MIB for i in m.instances.values())
    sequence = [Op.QUIESCE, Op.UNMAP, Op.MAP, Op.RESTORE]
    assert parts.transport.ops == {"0": sequence, "1": sequence}
    assert [e.kind for e in parts.events] == [SwapKind.OUT, SwapKind.IN]
    assert parts.table.host_bytes_of("a") == 8 * MIB  # the weight copies stay


def test_a_map_the_client_refuses_rolls_back_to_swapped_out(parts: Parts) -> None:
    m = resident(parts, "a")
    parts.swapper.swap_out_locked(m)
    parts.transport.refuse = {("0", Op.MAP)}
    with pytest.raises(ClientFailed, match="refused"):
        parts.swapper.swap_in_locked(m)
    assert m.state is S.SWAPPED_OUT and used(parts) == 0
    assert not m.instances["0"].mapped and m.instances["0"].regions["w"].chunks == []
    assert [e.kind for e in parts.events] == [SwapKind.OUT]  # no swap-in announced


def test_a_restore_one_instance_refuses_unmaps_both_and_rolls_back(parts: Parts) -> None:
    m = resident(parts, "a", instances=2, region_bytes=4 * MIB)
    parts.swapper.swap_out_locked(m)
    parts.transport.refuse = {("1", Op.RESTORE)}
    with pytest.raises(ClientFailed, match="restore on instance 1"):
        parts.swapper.swap_in_locked(m)
    assert m.state is S.SWAPPED_OUT and used(parts) == 0
    assert parts.transport.ops["0"][-3:] == [Op.MAP, Op.RESTORE, Op.UNMAP]
    assert parts.transport.ops["1"][-3:] == [Op.MAP, Op.RESTORE, Op.UNMAP]


def test_an_instance_whose_client_went_away_fails_the_restore(parts: Parts) -> None:
    """The client is gone between map and restore: the restore is never sent to the
    instances after it, and every mapped instance is unmapped again."""
    m = resident(parts, "a", instances=2, region_bytes=4 * MIB)
    parts.swapper.swap_out_locked(m)
    real_start = parts.transport.start

    def start(inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: Any) -> Any:
        if op is Op.RESTORE and inst.name == "0":
            raise ConnectionLost("connection lost")
        return real_start(inst, op, epoch, body, fds)

    parts.transport.start = start  # type: ignore[method-assign]
    with pytest.raises(ClientFailed, match="instance 0: connection lost"):
        parts.swapper.swap_in_locked(m)
    assert m.state is S.SWAPPED_OUT and used(parts) == 0
    assert parts.transport.ops["1"][-2:] == [Op.MAP, Op.UNMAP]  # no restore sent to it


def test_room_is_made_only_from_the_victims_given(parts: Parts) -> None:
    b = resident(parts, "b")
    parts.swapper.swap_out_locked(b)  # b: 8 MiB to bring back; a holds the room of 12 MiB
    a = resident(parts, "a")
    parts.events.clear()
    with pytest.raises(NoCapacity, match="0 victim"):
        parts.swapper.swap_in_locked(b)  # the engine chooses nobody
    assert a.state is S.RESIDENT and b.state is S.SWAPPED_OUT
    parts.swapper.swap_in_locked(b, victims=["gone", "a"])  # an unknown name is skipped
    assert a.state is S.SWAPPED_OUT and b.state is S.RESIDENT
    assert [(e.model, e.kind, e.cause) for e in parts.events] == [
        ("a", SwapKind.OUT, MAKE_ROOM),
        ("b", SwapKind.IN, ""),
    ]
    assert used(parts) == 8 * MIB


def test_removal_tells_every_client_and_forgets_the_model(parts: Parts) -> None:
    m = resident(parts, "a", instances=2, region_bytes=4 * MIB)
    parts.swapper.remove_locked(m)
    assert used(parts) == 0 and parts.store.used_bytes(0) == 0
    assert parts.transport.ops == {"0": [Op.REMOVED], "1": [Op.REMOVED]}
    assert all(cast(Connected, i.peer).closed for i in m.instances.values())
    with pytest.raises(UnknownModel):
        parts.table.get("a")


def test_a_victim_whose_process_dies_during_its_drain_leaves_its_room_at_once(
    parts: Parts,
) -> None:
    """Issue 26, item 6: the agent kills a victim that answers nothing while its drain
    waits; the swap-out goes on without it and releases its chunks right away (its
    socket's `client_gone` waits for the operation's lock), so the swap-in that chose it
    finds the room (NoCapacity before)."""
    victim = resident(parts, "a")
    other = resident(parts, "b", region_bytes=4 * MIB)
    parts.swapper.swap_out_locked(other)
    assert used(parts) == 8 * MIB
    real_start = parts.transport.start

    class Killed:
        def __init__(self, inst: InstanceRecord) -> None:
            self.inst = inst

        def wait(self, timeout_seconds: float | None = None) -> Message:
            cast(Connected, self.inst.peer).closed = True  # its socket closed: it died
            raise ConnectionLost("connection lost")

    def start(inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: Any) -> Any:
        if op is Op.QUIESCE and inst is victim.instances["0"]:
            return Killed(inst)
        return real_start(inst, op, epoch, body, fds)

    parts.transport.start = start  # type: ignore[method-assign]
    parts.swapper.make_room(other, 8 * MIB, ["a"])
    assert victim.state is S.SWAPPED_OUT
    assert not victim.instances["0"].mapped and victim.instances["0"].regions["w"].chunks == []
    assert used(parts) == 0
    assert parts.table.host_bytes_of("a") == 8 * MIB  # its host copy kept

"""A dropped (or failed) model's reload from the source that finds no room leaves it as it
was (`Swapper.reload_locked`): before, NoCapacity left the engine's record in LOADING, a
state that claims mapped memory, with nothing mapped and no request coming to commit it.
The swapper alone, as in test_engine_swapper.py: the real table, ledger and host store,
and a fake transport whose every client answers ok."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import ConnectionLost, Message, Op, RegionKind, reply_to
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.errors import NoCapacity
from modelswap_sidecar.engine.events import SwapEvents
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelConfig, ModelRecord, RegionRecord
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.table import ModelTable

MIB = 1 << 20
S = EngineState


@dataclass
class Connected:
    closed: bool = False


class Reply:
    def __init__(self, message: Message) -> None:
        self.message = message

    def wait(self, timeout_seconds: float | None = None) -> Message:
        return self.message


@dataclass
class Transport:
    ops: list[tuple[str, Op]] = field(default_factory=list)

    def start(
        self, inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: Any
    ) -> Reply:
        if inst.peer is None or inst.peer.closed:
            raise ConnectionLost("not connected")
        self.ops.append((inst.name, op))
        return Reply(reply_to(Message(op, len(self.ops), epoch, body), epoch, {}))

    def disconnect(self, inst: InstanceRecord) -> None:
        pass


@dataclass
class Parts:
    ledger: GpuLedger
    table: ModelTable
    swapper: Swapper
    transport: Transport


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    """A 12 MiB GPU."""
    allocator = SimAllocator(capacities_bytes=[12 * MIB], prefill=False)
    store = HostStore(tmp_path / "store", {0: 256 * MIB})
    table = ModelTable(store)
    ledger = GpuLedger(allocator, table, EngineSettings())
    transport = Transport()
    swapper = Swapper(
        table=table,
        ledger=ledger,
        transport=cast(Any, transport),
        store=store,
        settings=EngineSettings(),
        events=SwapEvents(),
        checkpoint=lambda name: None,
    )
    yield Parts(ledger, table, swapper, transport)
    allocator.close()


def model(p: Parts, name: str, state: EngineState, *, mapped: bool) -> ModelRecord:
    """One instance with one 8 MiB weight region; mapped (its chunks allocated) or not."""
    p.table.add(ModelConfig(name, 0))
    m = p.table.get(name)
    m.state = state
    region = RegionRecord("w", 8 * MIB, RegionKind.WEIGHTS, address=0)
    if mapped:
        region.chunks = p.ledger.allocate(0, 8 * MIB)
    m.instances["0"] = InstanceRecord(
        "0", {"w": region}, peer=cast(Any, Connected()), mapped=mapped, committed=mapped
    )
    return m


@pytest.mark.parametrize("state", [S.DROPPED, S.FAILED])
def test_a_reload_without_room_leaves_the_model_as_it_was(parts: Parts, state: EngineState) -> None:
    model(parts, "a", S.RESIDENT, mapped=True)  # holds 8 of the 12 MiB
    b = model(parts, "b", state, mapped=False)
    with pytest.raises(NoCapacity):
        parts.swapper.swap_in_locked(b)  # no victims given: the engine chooses nobody
    assert b.state is state, b.state
    assert "reload from the source failed" in b.reason
    assert not b.instances["0"].mapped and parts.ledger.view(0).used_bytes == 8 * MIB
    assert parts.transport.ops == []  # nothing was mapped

    # the next swap-in, given the victim, reloads it
    parts.swapper.swap_in_locked(b, victims=["a"])
    assert b.state is S.LOADING and b.instances["0"].mapped
    assert ("0", Op.MAP) in parts.transport.ops

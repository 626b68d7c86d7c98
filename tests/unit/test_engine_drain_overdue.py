"""A swap-out's drain that outlasts `drain_timeout_seconds` ends the model's requests, not
the swap-out (issue 26, item 3). Before, a generation whose client had gone (or that kept
streaming) held the drain until its timeout, the swap-out rolled back and was retried, and
other models needing the room got 503s. Now the engine tells its drain-overdue listener
(the agent wires the gateway, which cancels the model's requests at Triton) and waits
`drain_end_grace_seconds` more; once the work leaves, the swap-out completes.

In-process, against the real table, ledger and host store, with the fake client of
`test_engine_commit_drain` whose quiesce answers once the test says the in_use() work left:
the listener itself lets it leave, as the cancelled requests do."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import Op, RegionKind, SwapOutMode
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.errors import ClientFailed
from modelswap_sidecar.engine.events import SwapEvents
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelConfig, ModelRecord, RegionRecord
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper
from modelswap_sidecar.engine.table import ModelTable
from tests.support.waiting import wait_for
from tests.unit.test_engine_commit_drain import Call, Connected, DrainingClient

MIB = 1 << 20
S = EngineState
DRAIN_TIMEOUT_SECONDS = 0.3
GRACE_SECONDS = 5.0


class Parts:
    def __init__(self, tmp_path: Path, allocator: SimAllocator) -> None:
        self.store = HostStore(tmp_path / "store", {0: 256 * MIB})
        self.table = ModelTable(self.store)
        settings = EngineSettings(
            drain_timeout_seconds=DRAIN_TIMEOUT_SECONDS,
            drain_end_grace_seconds=GRACE_SECONDS,
            client_timeout_seconds=30.0,
        )
        self.ledger = GpuLedger(allocator, self.table, settings)
        self.client = DrainingClient()
        self.checkpoints: list[str] = []
        self.swapper = Swapper(
            table=self.table,
            ledger=self.ledger,
            transport=self.client,
            store=self.store,
            settings=settings,
            events=SwapEvents(),
            checkpoint=self.checkpoints.append,
        )

    def resident(self, name: str) -> ModelRecord:
        """A resident model (onSwapOut: host) whose one instance maps 8 MiB, committed."""
        self.table.add(ModelConfig(name, 0, on_swap_out=SwapOutMode.HOST))
        m = self.table.get(name)
        region = RegionRecord("w", 8 * MIB, RegionKind.WEIGHTS, address=0)
        region.chunks = self.ledger.allocate(0, 8 * MIB)
        m.instances["0"] = InstanceRecord(
            "0", {"w": region}, peer=cast(Any, Connected()), mapped=True, committed=True
        )
        self.table.set_state(m, S.RESIDENT, "test")
        return m

    def swap_out(self, m: ModelRecord) -> Call:
        def run() -> None:
            with m.lock:
                self.swapper.swap_out_locked(m, "making room")

        return Call(run)


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Parts]:
    allocator = SimAllocator(capacities_bytes=[12 * MIB], prefill=False)
    made = Parts(tmp_path, allocator)
    yield made
    made.client.in_use_left.set()  # nothing stays blocked past the test
    allocator.close()


def test_an_overdue_drain_ends_the_requests_and_the_swap_out_completes(parts: Parts) -> None:
    m = parts.resident("generate")
    told: list[tuple[str, S]] = []

    def overdue(name: str) -> None:
        # the gateway cancels the model's requests; Triton cancels them; in_use() is left
        told.append((name, m.state))
        parts.client.in_use_left.set()

    parts.swapper.drain_overdue = overdue
    out = parts.swap_out(m)
    assert out.done_within(DRAIN_TIMEOUT_SECONDS + GRACE_SECONDS), "the drain was not ended"
    assert out.error is None, out.error
    assert told == [("generate", S.DRAINING)]
    assert "swap_out.drain_overdue" in parts.checkpoints
    assert m.state is S.SWAPPED_OUT and parts.ledger.view(0).used_bytes == 0
    assert parts.client.ops == [Op.QUIESCE, Op.UNMAP]


def test_a_drain_within_its_timeout_never_tells_the_listener(parts: Parts) -> None:
    m = parts.resident("quick")
    told: list[str] = []
    parts.swapper.drain_overdue = told.append
    parts.client.in_use_left.set()  # no work in flight: the drain answers at once
    out = parts.swap_out(m)
    assert out.done_within(5.0) and out.error is None, out.error
    # the drain's timer was cancelled with it: no thread is left to call the listener
    wait_for(
        lambda: not any(isinstance(t, threading.Timer) for t in threading.enumerate()),
        5.0,
        "the drain's timer to end",
    )
    assert told == [] and m.state is S.SWAPPED_OUT


def test_work_that_outlasts_the_grace_too_rolls_the_swap_out_back(parts: Parts) -> None:
    """A model that ignores cancellation: the swap-out still ends, rolled back, after the
    timeout and the grace (the old outcome, now only for work nothing could end)."""
    parts.swapper.settings = EngineSettings(
        drain_timeout_seconds=DRAIN_TIMEOUT_SECONDS, drain_end_grace_seconds=0.3
    )
    m = parts.resident("stubborn")
    told: list[str] = []
    parts.swapper.drain_overdue = told.append  # ends nothing
    out = parts.swap_out(m)
    assert out.done_within(5.0)
    assert isinstance(out.error, ClientFailed), out.error
    assert told == ["stubborn"]
    assert m.state is S.RESIDENT and parts.ledger.view(0).used_bytes == 8 * MIB
    assert parts.client.ops == [Op.QUIESCE, Op.RESUME]

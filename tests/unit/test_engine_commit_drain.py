"""A model loading its weights is never a victim (issue 26, item 4): a dropped model
swapped in loads its weights inside `in_use()` and commits there, so a swap-out that
drains it waits for that very commit. Before the fix the swap-out held the model's lock
through the drain and the commit waited for the lock: both stalled until the drain timed
out (60 s). Now a commit that comes in during a drain runs beside it and the swap-out
gives way once it ends; a swap-out that finds a commit waiting is refused at once; a
victim list skips such a model.

In-process, against the real table, ledger and host store: the fake client's quiesce
blocks until the test says its `in_use()` work left, and the engine's checkpoint hook is
a barrier the test opens, so every ordering here is forced, never raced."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from modelswap_api.wire import (
    ErrorCode,
    Message,
    Op,
    RegionKind,
    SwapOutMode,
    error_reply,
    reply_to,
)
from modelswap_sidecar.allocators.sim import SimAllocator
from modelswap_sidecar.engine.attaching import Attacher
from modelswap_sidecar.engine.errors import Committing, NoCapacity, WrongState
from modelswap_sidecar.engine.events import SwapEvents
from modelswap_sidecar.engine.hoststore import HostStore
from modelswap_sidecar.engine.ledger import GpuLedger
from modelswap_sidecar.engine.records import InstanceRecord, ModelConfig, ModelRecord, RegionRecord
from modelswap_sidecar.engine.recovery import Recovery
from modelswap_sidecar.engine.settings import EngineSettings
from modelswap_sidecar.engine.states import EngineState
from modelswap_sidecar.engine.swaps import Swapper, awaiting_reload
from modelswap_sidecar.engine.table import ModelTable
from tests.support.waiting import wait_for

MIB = 1 << 20
S = EngineState
#: How long a step that must not wait on anything may take (the stall it replaces: 60 s).
PROMPT_SECONDS = 5.0


@dataclass
class Connected:
    closed: bool = False


class Answer:
    def __init__(self, message: Message, until: threading.Event | None = None) -> None:
        self.message = message
        self.until = until

    def wait(self, timeout_seconds: float | None = None) -> Message:
        if self.until is not None and not self.until.wait(timeout_seconds):
            return error_reply(self.message, 0, ErrorCode.TIMEOUT, "drain timed out")
        return self.message


@dataclass
class DrainingClient:
    """Every instance answers ok at once, except `quiesce`: like the client library's
    drain it answers only once `in_use_left` is set (the model's in_use() work ended)."""

    in_use_left: threading.Event = field(default_factory=threading.Event)
    ops: list[Op] = field(default_factory=list)

    def start(
        self, inst: InstanceRecord, op: Op, epoch: int, body: dict[str, Any], fds: Any
    ) -> Answer:
        self.ops.append(op)
        reply = reply_to(Message(op, len(self.ops), epoch, body), epoch, {})
        return Answer(reply, self.in_use_left if op is Op.QUIESCE else None)

    def disconnect(self, inst: InstanceRecord) -> None:
        cast(Connected, inst.peer).closed = True


class Barrier:
    """The engine's checkpoint hook: stops the thread that reaches `name` until opened."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.reached = threading.Event()
        self.opened = threading.Event()

    def __call__(self, name: str) -> None:
        if name == self.name:
            self.reached.set()
            self.opened.wait(60)


@dataclass
class Engine:
    table: ModelTable
    ledger: GpuLedger
    store: HostStore
    client: DrainingClient
    swapper: Swapper
    attacher: Attacher
    barrier: Barrier


@pytest.fixture
def parts(tmp_path: Path) -> Iterator[Callable[[str], Engine]]:
    """A 12 MiB GPU, a 256 MiB host store; the checkpoint barrier named by the caller."""
    allocator = SimAllocator(capacities_bytes=[12 * MIB], prefill=False)
    barriers: list[Barrier] = []

    def make(barrier_at: str = "") -> Engine:
        store = HostStore(tmp_path / "store", {0: 256 * MIB})
        table = ModelTable(store)
        settings = EngineSettings(drain_timeout_seconds=30.0, client_timeout_seconds=30.0)
        ledger = GpuLedger(allocator, table, settings)
        client = DrainingClient()
        barrier = Barrier(barrier_at)
        barriers.append(barrier)
        swapper = Swapper(
            table=table,
            ledger=ledger,
            transport=client,
            store=store,
            settings=settings,
            events=SwapEvents(),
            checkpoint=barrier,
        )
        attacher = Attacher(
            table=table,
            ledger=ledger,
            swapper=swapper,
            recovery=Recovery(table, ledger, swapper, store, settings),
            transport=client,
            store=store,
            settings=settings,
            checkpoint=barrier,
        )
        return Engine(table, ledger, store, client, swapper, attacher, barrier)

    yield make
    for b in barriers:  # nothing stays blocked past the test
        b.opened.set()
    allocator.close()


def reloading(e: Engine, name: str, drop: bool = True) -> ModelRecord:
    """As a drop's swap-in leaves it: fresh chunks mapped, nothing committed, LOADING."""
    mode = SwapOutMode.DROP if drop else SwapOutMode.HOST
    e.table.add(ModelConfig(name, 0, on_swap_out=mode))
    m = e.table.get(name)
    region = RegionRecord("w", 8 * MIB, RegionKind.WEIGHTS, address=0)
    region.chunks = e.ledger.allocate(0, 8 * MIB)
    m.instances["0"] = InstanceRecord(
        "0", {"w": region}, peer=cast(Any, Connected()), mapped=True, committed=False
    )
    return m


def used(e: Engine) -> int:
    return e.ledger.view(0).used_bytes


class Call:
    """A call on its own thread (as the engine's callers make them); `outcome` once done."""

    def __init__(self, fn: Callable[[], object]) -> None:
        self.result: object = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(fn,), daemon=True)
        self.thread.start()

    def _run(self, fn: Callable[[], object]) -> None:
        try:
            self.result = fn()
        except BaseException as e:  # the test reads it
            self.error = e

    def done_within(self, seconds: float) -> bool:
        self.thread.join(seconds)
        return not self.thread.is_alive()


def swap_out(e: Engine, m: ModelRecord) -> Call:
    """`Engine.swap_out`: the swap-out under the model's operation lock."""

    def run() -> None:
        with m.lock:
            e.swapper.swap_out_locked(m, "making room")

    return Call(run)


def commit(e: Engine, m: ModelRecord) -> Call:
    message = Message(Op.COMMIT, 1, m.epoch, {"fingerprint": "f1"})
    return Call(lambda: e.attacher.commit(m, m.instances["0"], message))


def test_a_commit_during_the_drain_of_its_model_is_not_a_wait_and_the_swap_out_gives_way(
    parts: Callable[[str], Engine],
) -> None:
    """The stall of item 4, forced: the quiesce is provably waiting for in_use() (the
    fake client holds it) when the commit from inside in_use() comes in."""
    e = parts("")
    m = reloading(e, "classify")
    assert awaiting_reload(m)
    out = swap_out(e, m)
    wait_for(lambda: Op.QUIESCE in e.client.ops, 10, "the swap-out's quiesce")
    assert m.state is S.DRAINING

    saved = commit(e, m)
    assert saved.done_within(PROMPT_SECONDS), "the commit waited for the draining swap-out"
    assert saved.error is None, saved.error
    assert m.instances["0"].committed and m.instances["0"].fingerprint == "f1"
    assert not out.done_within(0.1)  # the drain still waits for the in_use() work

    e.client.in_use_left.set()  # the request that loaded and committed ends
    assert out.done_within(PROMPT_SECONDS)
    assert isinstance(out.error, Committing), out.error
    # rolled back: the model stays, loaded and committed, serving its requests
    assert m.state is S.RESIDENT and used(e) == 8 * MIB
    assert m.instances["0"].regions["w"].weights_file is not None
    assert e.client.ops == [Op.QUIESCE, Op.SAVE, Op.RESUME]
    assert not m.draining and m.commits == 0 and m.joined_commits == 0


def test_a_swap_out_that_finds_a_commit_waiting_is_refused_before_it_drains(
    parts: Callable[[str], Engine],
) -> None:
    """The other order: the commit is counted (held at its first checkpoint, before the
    lock) when the swap-out takes the lock. It must not drain."""
    e = parts("commit.received")
    m = reloading(e, "classify")
    saved = commit(e, m)
    assert e.barrier.reached.wait(10)

    out = swap_out(e, m)
    assert out.done_within(PROMPT_SECONDS)
    assert isinstance(out.error, Committing), out.error
    assert e.client.ops == [] and m.state is S.LOADING and used(e) == 8 * MIB

    e.barrier.opened.set()
    assert saved.done_within(PROMPT_SECONDS) and saved.error is None, saved.error
    assert m.state is S.RESIDENT and e.client.ops == [Op.SAVE]


def test_a_victim_list_skips_a_model_that_is_committing(parts: Callable[[str], Engine]) -> None:
    e = parts("commit.received")
    a = reloading(e, "classify")
    e.table.add(ModelConfig("b", 0))
    b = e.table.get("b")
    b.instances["0"] = InstanceRecord(
        "0",
        {"w": RegionRecord("w", 8 * MIB, RegionKind.WEIGHTS, address=0)},
        peer=cast(Any, Connected()),
    )
    b.state = S.DROPPED
    saved = commit(e, a)
    assert e.barrier.reached.wait(10)

    def swap_in() -> None:
        with e.ledger.allocation_lock(0), b.lock:
            e.swapper.swap_in_locked(b, victims=["classify"])

    room = Call(swap_in)
    assert room.done_within(PROMPT_SECONDS)
    assert isinstance(room.error, NoCapacity), room.error
    assert a.state is S.LOADING and not b.instances["0"].mapped and used(e) == 8 * MIB
    assert e.client.ops == []  # classify was never drained
    e.barrier.opened.set()
    assert saved.done_within(PROMPT_SECONDS) and saved.error is None
    assert a.state is S.RESIDENT


def test_a_commit_after_the_drain_ended_waits_for_the_lock_as_before(
    parts: Callable[[str], Engine],
) -> None:
    """Only a commit that comes in while the drain waits runs beside the swap-out; once
    the drain ended (the swap-out held at `swap_out.quiesced`), a commit waits for the
    lock and finds the model gone."""
    e = parts("swap_out.quiesced")
    m = reloading(e, "classify")
    e.client.in_use_left.set()
    out = swap_out(e, m)
    assert e.barrier.reached.wait(10)
    saved = commit(e, m)
    wait_for(lambda: m.commits == 1, 10, "the commit counted")
    assert not saved.done_within(0.2) and m.joined_commits == 0

    e.barrier.opened.set()
    assert out.done_within(PROMPT_SECONDS) and out.error is None, out.error
    assert m.state is S.DROPPED and used(e) == 0
    assert saved.done_within(PROMPT_SECONDS)
    assert isinstance(saved.error, WrongState) and not m.instances["0"].committed


def test_a_failed_drain_waits_for_the_commit_beside_it_then_rolls_back_loaded(
    parts: Callable[[str], Engine],
) -> None:
    """The drain times out (a client's other work never left) while a commit ran beside
    it: the rollback finds every instance committed and leaves the model RESIDENT."""
    e = parts("commit.saved")
    m = reloading(e, "classify", drop=False)
    out = swap_out(e, m)
    wait_for(lambda: Op.QUIESCE in e.client.ops, 10, "the swap-out's quiesce")
    saved = commit(e, m)
    assert e.barrier.reached.wait(10)  # the commit runs beside the drain, held here
    e.client.in_use_left.set()  # the quiesce answers; the swap-out must wait for the commit
    assert not out.done_within(0.2) and m.state is S.DRAINING

    e.barrier.opened.set()
    assert saved.done_within(PROMPT_SECONDS) and saved.error is None, saved.error
    assert out.done_within(PROMPT_SECONDS)
    assert isinstance(out.error, Committing)
    assert m.state is S.RESIDENT and used(e) == 8 * MIB


def test_a_commit_with_nothing_to_save_answers_at_once_and_the_swap_out_goes_on(
    parts: Callable[[str], Engine],
) -> None:
    """A second commit of committed weights (no `replace`) during a drain saves nothing:
    it answers at once and the swap-out is not called off for it."""
    e = parts("")
    m = reloading(e, "classify", drop=False)
    m.instances["0"].committed = True
    m.state = S.RESIDENT
    out = swap_out(e, m)
    wait_for(lambda: Op.QUIESCE in e.client.ops, 10, "the swap-out's quiesce")
    again = commit(e, m)
    assert again.done_within(PROMPT_SECONDS) and again.error is None, again.error
    e.client.in_use_left.set()
    assert out.done_within(PROMPT_SECONDS) and out.error is None, out.error
    assert m.state is S.SWAPPED_OUT and used(e) == 0
    assert e.client.ops == [Op.QUIESCE, Op.UNMAP]
